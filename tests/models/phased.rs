//! The phased encoder ([`Encoder::phased`]): driven on a real runtime with
//! two CPU workers, every tiny family model (and tiny-bert) gives the
//! one-kernel pass's vectors; a step with a row block or a head skipped or
//! computed twice is refused; and (ignored, a rough speed check) one
//! 256-token sentence of all-MiniLM-L6-v2 on one core against two.

use std::path::{Path, PathBuf};
use std::time::Instant;

use coexec_kernels::{Kernel, KernelError, OneShot, Workload, run_sequential, with_chunk};
use coexec_models::Embedder;
use coexec_models::encoder::{Encoder, EncoderPhases, Pooling, ROW_BLOCK};

/// Every model folder of tests/data/families, and tests/data/tiny-bert.
fn models() -> Vec<PathBuf> {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(data.join("families"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("config.json").exists())
        .collect();
    dirs.sort();
    dirs.push(data.join("tiny-bert"));
    assert!(dirs.len() >= 18, "{} model folders", dirs.len());
    dirs
}

fn name(dir: &Path) -> String {
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

/// Text long enough to reach any tiny model's limit.
fn long_text() -> String {
    "the quick brown fox jumps over the lazy dog near the riverbank. ".repeat(120)
}

/// A batch of one sequence at the model's length limit, and one of three of
/// mixed length with that one in the middle (a classifier's short one a
/// pair, so that its second text's token type is in play).
fn batches(model: &Embedder) -> Vec<(&'static str, Vec<Vec<u32>>)> {
    let limit = model.max_input_length();
    let long = model.tokenize(&long_text(), true).unwrap();
    assert_eq!(long.len(), limit, "{}: the long text's tokens", model.id());
    let short = match model.labels() {
        Some(_) => model
            .tokenize_pair("is it?", "a short answer", true)
            .unwrap(),
        None => model.tokenize("a short one", true).unwrap(),
    };
    let words: String = long_text().chars().take(200).collect();
    let medium = model.tokenize(&words, true).unwrap();
    vec![
        ("one at the limit", vec![long.clone()]),
        ("three of mixed length", vec![short, long, medium]),
    ]
}

/// The largest `|a - b|` over a vector's largest `|b|`, over all vectors.
fn worst_relative(a: &[Vec<f32>], b: &[Vec<f32>]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| {
            assert_eq!(a.len(), b.len());
            let scale = b.iter().fold(0f64, |m, v| m.max(v.abs() as f64));
            let diff = a
                .iter()
                .zip(b)
                .fold(0f64, |m, (x, y)| m.max((*x as f64 - *y as f64).abs()));
            diff / scale.max(f64::MIN_POSITIVE)
        })
        .fold(0.0, f64::max)
}

async fn runtime() -> coexec::Runtime {
    coexec::Runtime::builder()
        .devices("cpu:2")
        .unwrap()
        .in_memory_profiles()
        .start()
        .await
        .unwrap()
}

/// Job options that keep a step off the submitting thread (a tiny model's
/// step is short enough to run there whole), so that the workers split it.
fn spread() -> coexec::JobOptions {
    coexec::JobOptions::new().inline(false)
}

/// Whether a step of `reports` ran in more than one chunk.
fn any_split(reports: &[coexec::RunReport]) -> bool {
    reports
        .iter()
        .any(|r| r.classes.iter().map(|c| c.chunks).sum::<usize>() > 1)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn phased_pass_matches_the_one_kernel_pass_on_every_family() {
    let rt = runtime().await;
    let (mut worst, mut worst_tokens) = ((0.0, String::new()), (0.0, String::new()));
    for dir in models() {
        let name = name(&dir);
        let model = Embedder::load(&dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        let w = model.weights().clone();
        if w.config().pooling == Pooling::Splade {
            let (_, seqs) = batches(&model).remove(0);
            let e = Encoder::new(w, seqs).unwrap().phased().unwrap_err();
            assert!(e.to_string().contains("SPLADE"), "{name}: {e}");
            continue;
        }
        let mut split = false;
        for (what, seqs) in batches(&model) {
            let one = Encoder::new(w.clone(), seqs.clone()).unwrap();
            let one = run_sequential(OneShot::new(one)).unwrap().unwrap();
            let job = Encoder::new(w.clone(), seqs.clone()).unwrap().phased();
            let (k, reports) = rt.drive(job.unwrap(), spread()).await.unwrap();
            assert_eq!(reports.len(), 2 * w.config().layers + 1, "{name}: steps");
            split |= any_split(&reports);
            let d = worst_relative(&k.into_vectors(), &one.into_vectors());
            assert!(d <= 1e-6, "{name}, {what}: relative difference {d:e}");
            if d >= worst.0 {
                worst = (d, format!("{name}, {what}"));
            }
            // Every token's vector, in blocks of 16 rows: many blocks, a
            // sequence across several.
            let tokens = |k: Encoder| k.into_token_vectors().concat();
            let one = Encoder::token_vectors(w.clone(), seqs.clone()).unwrap();
            let one = tokens(run_sequential(OneShot::new(one)).unwrap().unwrap());
            let job = Encoder::token_vectors(w.clone(), seqs).unwrap().phased();
            let job = job.unwrap().rows_per_block(16);
            let (k, reports) = rt.drive(job, spread()).await.unwrap();
            split |= any_split(&reports);
            let d = worst_relative(&tokens(k), &one);
            // A token's vector is one row of a GEMM cut otherwise (blocks of
            // 16 rows against the whole tile's): its rounding is not
            // averaged away by the pooling.
            assert!(
                d <= 1e-5,
                "{name}, {what}, tokens: relative difference {d:e}"
            );
            if d >= worst_tokens.0 {
                worst_tokens = (d, format!("{name}, {what}"));
            }
        }
        assert!(split, "{name}: every step ran in one chunk");
    }
    eprintln!("largest relative difference {:e} ({})", worst.0, worst.1);
    eprintln!(
        "largest relative difference of a token's vector {:e} ({})",
        worst_tokens.0, worst_tokens.1
    );
}

/// Runs the pieces `lo..hi` of the next step by hand and absorbs it.
fn step_in_pieces(job: &mut EncoderPhases, pieces: &[(usize, usize)]) -> Result<(), KernelError> {
    let mut step = job.next_step()?.expect("a step");
    for &(lo, hi) in pieces {
        with_chunk(&mut step, lo..hi, |k, c| k.run_cpu(c))?;
    }
    job.absorb(step)
}

/// Runs the next step whole and absorbs it: its items.
fn next_items(job: &mut EncoderPhases) -> usize {
    let mut step = job.next_step().unwrap().expect("a step");
    let n = step.items();
    with_chunk(&mut step, 0..n, |k, c| k.run_cpu(c)).unwrap();
    job.absorb(step).unwrap();
    n
}

#[test]
fn a_skipped_or_repeated_row_block_or_head_is_refused() {
    let model =
        Embedder::load(Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-bert"))
            .unwrap();
    let w = model.weights().clone();
    assert_eq!(w.config().heads, 2);
    // 80 rows: blocks 0..32, 32..64, 64..80.
    let seqs = vec![(0..80).map(|i| 100 + i).collect::<Vec<u32>>()];
    let job = || {
        let k = Encoder::new(w.clone(), seqs.clone()).unwrap();
        k.phased().unwrap().rows_per_block(32)
    };
    let refused = |r: Result<(), KernelError>, want: &str| {
        let e = r.expect_err(want).to_string();
        assert!(e.contains(want), "{e}");
    };
    // Rows: the embedding step.
    refused(
        step_in_pieces(&mut job(), &[(0, 32), (64, 80)]),
        "row block 1 was computed 0 times",
    );
    refused(
        step_in_pieces(&mut job(), &[(0, 80), (32, 64)]),
        "row block 1 was computed 2 times",
    );
    refused(
        step_in_pieces(&mut job(), &[(0, 64)]),
        "row block 2 was computed 0 times",
    );
    // Heads: layer 0's.
    let at_heads = || {
        let mut j = job();
        assert_eq!(next_items(&mut j), 80);
        j
    };
    refused(
        step_in_pieces(&mut at_heads(), &[(0, 1)]),
        "head 1 was computed 0 times",
    );
    refused(
        step_in_pieces(&mut at_heads(), &[(0, 2), (0, 1)]),
        "head 0 was computed 2 times",
    );
    // Uneven pieces of every step, by hand, give the one-kernel vectors.
    let mut j = job();
    while let Some(mut step) = j.next_step().unwrap() {
        let n = step.items();
        let cut = if n == 80 { 64 } else { 1 };
        with_chunk(&mut step, cut..n, |k, c| k.run_cpu(c)).unwrap();
        with_chunk(&mut step, 0..cut, |k, c| k.run_cpu(c)).unwrap();
        j.absorb(step).unwrap();
    }
    let one = run_sequential(OneShot::new(Encoder::new(w.clone(), seqs.clone()).unwrap()))
        .unwrap()
        .unwrap()
        .into_vectors();
    let d = worst_relative(&j.finish().into_vectors(), &one);
    assert!(d <= 1e-6, "relative difference {d:e}");
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// A rough speed check, not a timed test: one 256-token sentence of
/// all-MiniLM-L6-v2, the one-kernel pass on one thread against the phased
/// pass on `cpu:2` (in blocks of [`ROW_BLOCK`] rows, and in one block per
/// worker), the median of 20 interleaved runs each.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a timing, and needs ~/.cache/coexec/models/all-MiniLM-L6-v2: run with --ignored --nocapture"]
async fn phased_minilm_one_sentence_on_two_cores() {
    let dir = PathBuf::from(std::env::var_os("HOME").unwrap())
        .join(".cache/coexec/models/all-MiniLM-L6-v2");
    let model = Embedder::load(&dir).unwrap();
    let w = model.weights().clone();
    let ids = model.tokenize(&long_text(), true).unwrap();
    assert_eq!(ids.len(), 256);
    let rt = runtime().await;
    // One kernel on one thread; phased in blocks of ROW_BLOCK rows; phased
    // in two blocks (the tokens over the two workers).
    let mut times = [Vec::new(), Vec::new(), Vec::new()];
    for round in 0..23 {
        let k = Encoder::new(w.clone(), vec![ids.clone()]).unwrap();
        let t0 = Instant::now();
        let a = run_sequential(OneShot::new(k))
            .unwrap()
            .unwrap()
            .into_vectors();
        let mut t = [t0.elapsed().as_secs_f64(), 0.0, 0.0];
        for (i, block) in [(1, ROW_BLOCK), (2, ids.len().div_ceil(2))] {
            let k = Encoder::new(w.clone(), vec![ids.clone()]).unwrap();
            let job = k.phased().unwrap().rows_per_block(block);
            let t0 = Instant::now();
            let (b, _) = rt.drive(job, Default::default()).await.unwrap();
            t[i] = t0.elapsed().as_secs_f64();
            let d = worst_relative(&b.into_vectors(), &a);
            assert!(d <= 1e-6, "relative difference {d:e}");
        }
        // The first rounds warm the caches and the speed models.
        if round >= 3 {
            for (v, t) in times.iter_mut().zip(t) {
                v.push(t);
            }
        }
    }
    let [one, rows, halves] = times.map(|mut v| median(&mut v));
    eprintln!(
        "one kernel, one thread: {:.2} ms; phased on cpu:2 in blocks of {ROW_BLOCK} rows: {:.2} ms \
         (ratio {:.2}), in blocks of {} rows: {:.2} ms (ratio {:.2})",
        one * 1e3,
        rows * 1e3,
        rows / one,
        ids.len().div_ceil(2),
        halves * 1e3,
        halves / one
    );
}

/// Through a stream on `cpu:2`: a single sequence of at least
/// `PHASED_MIN_TOKENS` tokens runs in phases (the runtime counts far more
/// items than its one job would: the phases' rows and heads) and answers
/// the one-kernel vector; a short one runs as one job.
#[test]
fn a_stream_runs_a_lone_long_sequence_in_phases() {
    use std::sync::Arc;

    use coexec::stream::{Model, Stream, StreamConfig};

    let tokio = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tiny-bert");
        let model = Arc::new(Embedder::load(&dir).unwrap());
        let rt = Arc::new(
            coexec::Runtime::builder()
                .devices("cpu:2")
                .unwrap()
                .in_memory_profiles()
                .build()
                .unwrap(),
        );
        let stream = Stream::start(rt.clone(), model.clone(), StreamConfig::new()).unwrap();
        let items = || rt.progress().iter().map(|(_, n)| n).sum::<u64>();
        let long = model.tokenize(&long_text(), true).unwrap();
        assert!(long.len() >= coexec_models::PHASED_MIN_TOKENS);
        let short = long[..4].to_vec();
        for (ids, phased) in [(long, true), (short, false)] {
            let before = items();
            let got = stream.infer(ids.clone()).await.unwrap();
            let ran = items() - before;
            let one = model.build(vec![ids.clone()]).unwrap();
            let one_items = one.items() as u64;
            let want = run_sequential(OneShot::new(one)).unwrap().unwrap();
            let want = model.outputs(want).unwrap().remove(0);
            let diff = got
                .iter()
                .zip(&want)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(diff < 1e-5, "{} tokens: differs by {diff}", ids.len());
            if phased {
                // Every row in each of layers + 1 row steps, and every
                // head in each layer's attention step.
                let c = model.weights().config();
                let (t, l) = (ids.len() as u64, c.layers as u64);
                assert_eq!(
                    ran,
                    t * (l + 1) + c.heads as u64 * l,
                    "{} tokens",
                    ids.len()
                );
            } else {
                assert_eq!(ran, one_items, "a short sequence is one job");
            }
        }
        stream.shutdown().await;
    });
}
