//! Every kernel's CUDA twin against its CPU implementation: bit-equal, in
//! deterministic mode (the default); the mlp's cuBLAS twin to float tolerance
//! and the same labels.
//!
//! Each test needs a GPU, a driver and NVRTC, so each is `#[ignore]`d: a plain
//! `cargo test` reports them as ignored, never as passed. Asked for with
//! `--include-ignored` on a machine without a GPU they fail, saying why. The GPU runs
//! use two streams of device 0 on two threads, with chunks of uneven sizes,
//! so the run cache, staging reuse and chunk edges are exercised too. Each
//! stream starts each run as the runtime does (`prepare`, `begin_run`), so
//! large kernel buffers are page-locked and copied straight from and to
//! (the default); `pinned_and_staged_copies_agree_bit_for_bit` runs the
//! staged path beside it, and `matmul_pinned_chunks_copy_at_dma_speed`
//! prints the host-to-device rates both reach.

use std::io::Write;

use coexec_kernels::cuda::{self, CudaKernel, StreamWorker};
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use coexec_kernels::workloads::{
    KmeansConfig, KmeansData, KmeansJob, LabeledRows, Matmul, MatmulJob, MatmulProblem, Mlp,
    MlpWeights, NbodyJob, NbodyProblem, PathfinderJob, PathfinderProblem, Workload, argmax,
    run_sequential,
};
use coexec_kernels::{Kernel, KernelError, OneShot, Synthetic, claim_parts};

/// One line straight to the terminal, in one write: the harness captures
/// `eprintln!`, and tests on other threads write at the same time.
fn say(line: &str) {
    let _ = std::io::stderr().write_all(format!("{line}\n").as_bytes());
}

/// Two workers on device 0, or `None` (after saying why) where there is no GPU.
fn workers(test: &str) -> Option<[StreamWorker; 2]> {
    let skip = |why: String| {
        say(&format!("{test}: no CUDA device ({why})"));
        panic!("{test} needs a CUDA device and found none ({why})")
    };
    match cuda::devices() {
        Err(e) => return skip(e.to_string()),
        Ok(d) if d.is_empty() => return skip("the driver sees no device".into()),
        Ok(_) => {}
    }
    match (StreamWorker::new(0, 0), StreamWorker::new(0, 1)) {
        (Ok(a), Ok(b)) => Some([a, b]),
        (Err(e), _) | (_, Err(e)) => panic!("a GPU is listed but no stream opens: {e}"),
    }
}

/// Cut points of `0..n` at uneven places (aligned to `grain`), dealt to the
/// two workers alternately.
fn cuts(n: usize, grain: usize) -> Vec<usize> {
    let mut cuts = vec![
        0,
        1,
        7,
        64,
        65,
        n / 3,
        n / 2 + 1,
        n - n / 7,
        n.saturating_sub(1),
        n,
    ];
    for c in cuts.iter_mut() {
        *c = (*c / grain * grain).min(n);
    }
    cuts.push(n);
    cuts.sort_unstable();
    cuts.dedup();
    cuts.insert(0, 0);
    cuts.dedup();
    cuts
}

/// Runs every chunk of `k` on the two workers, on two threads; panics when
/// NVRTC is missing.
fn run_gpu<K: Kernel + CudaKernel>(
    test: &str,
    ws: &mut [StreamWorker; 2],
    k: &mut K,
) -> Result<bool, KernelError> {
    let cuts = cuts(k.items(), k.grain());
    run_cuts(test, ws, k, &cuts)
}

/// Runs the chunks between `cuts` of `k` on the two workers, dealt
/// alternately, on two threads, each worker starting the run as the runtime
/// does (`prepare`, then `begin_run`); panics when NVRTC is missing.
fn run_cuts<K: Kernel + CudaKernel>(
    test: &str,
    ws: &mut [StreamWorker; 2],
    k: &mut K,
    cuts: &[usize],
) -> Result<bool, KernelError> {
    let (k, all) = claim_parts(k, cuts);
    // Dealt alternately: each claim moves to the one thread that runs it.
    let mut hands: [Vec<_>; 2] = [Vec::new(), Vec::new()];
    for (i, c) in all.into_iter().enumerate() {
        hands[i % 2].push(c);
    }
    let [w0, w1] = ws;
    let r = std::thread::scope(|s| {
        let h: Vec<_> = [w0, w1]
            .into_iter()
            .zip(hands)
            .map(|(w, hand)| {
                s.spawn(move || {
                    w.prepare(k)?;
                    w.begin_run(k)?;
                    for c in &hand {
                        w.run(k, c)?;
                    }
                    Ok::<(), KernelError>(())
                })
            })
            .collect();
        h.into_iter()
            .map(|h| h.join().expect("GPU worker thread panicked"))
            .collect::<Result<Vec<()>, KernelError>>()
    });
    match r {
        Ok(_) => Ok(true),
        Err(KernelError::CudaUnavailable(why)) => {
            panic!("{test} needs a CUDA device and found none ({why})")
        }
        Err(e) => Err(e),
    }
}

/// Drives `w` to the end with every step on the GPU.
fn run_workload_gpu<W: Workload>(
    test: &str,
    ws: &mut [StreamWorker; 2],
    mut w: W,
) -> Option<W::Output>
where
    W::Step: CudaKernel,
{
    while let Some(mut step) = w.next_step().expect("next step") {
        if !run_gpu(test, ws, &mut step).expect("GPU run") {
            return None;
        }
        w.absorb(step).expect("absorb");
    }
    Some(w.finish())
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The index and values of the first difference, for a readable failure.
fn first_diff<T: PartialEq + Copy + std::fmt::Debug>(a: &[T], b: &[T]) -> Option<(usize, T, T)> {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .position(|(x, y)| x != y)
        .map(|i| (i, a[i], b[i]))
}

#[test]
fn devices_lists_or_explains() {
    match cuda::devices() {
        Ok(d) => {
            for g in &d {
                println!("{g:?}");
            }
        }
        Err(KernelError::CudaUnavailable(why)) => {
            say(&format!("devices_lists_or_explains: no CUDA ({why})"));
        }
        Err(e) => panic!("devices() must answer CudaUnavailable without a GPU, got {e}"),
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn synthetic_cuda_equals_cpu() {
    let test = "synthetic_cuda_equals_cpu";
    let Some(mut ws) = workers(test) else { return };
    let mut k = Synthetic::new(100_003, 200);
    if !run_gpu(test, &mut ws, &mut k).unwrap() {
        return;
    }
    k.verify().unwrap();
}

/// Runs all of `k` as one chunk on `w`; the result and the seconds it took.
fn run_whole(w: &mut StreamWorker, k: &mut Synthetic) -> (Result<(), KernelError>, f64) {
    let n = k.items();
    let (k, chunks) = claim_parts(k, &[0, n]);
    let t = Instant::now();
    let r = w.run(k, &chunks[0]);
    (r, t.elapsed().as_secs_f64())
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn a_long_chunk_is_taken_back_from_a_stream_that_then_runs_on() {
    let test = "a_long_chunk_is_taken_back_from_a_stream_that_then_runs_on";
    let Some([mut w, _]) = workers(test) else {
        return;
    };
    let flags: Arc<[AtomicBool]> = (0..1).map(|_| AtomicBool::new(false)).collect();
    w.watch_take_back(flags.clone(), 0);
    // A chunk sized to take ~3 s, from a timed one (compiled first).
    let n = 1 << 20;
    let mut warm = Synthetic::new(n, 1);
    run_whole(&mut w, &mut warm).0.unwrap();
    let base = 20_000u32;
    let (r, t) = run_whole(&mut w, &mut Synthetic::new(n, base));
    r.unwrap();
    let work = (base as f64 * 3.0 / t.max(1e-6)).clamp(1.0, u32::MAX as f64) as u32;
    let mut long = Synthetic::new(n, work);

    // Taken back 0.2 s in: the call returns then, having written nothing.
    let f = flags.clone();
    let setter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        f[0].store(true, Ordering::Release);
    });
    let (r, took) = run_whole(&mut w, &mut long);
    setter.join().unwrap();
    say(&format!(
        "{test}: {base} rounds took {t:.4} s; {work} rounds taken back after {took:.3} s: {r:?}"
    ));
    assert!(
        matches!(r, Err(KernelError::TakenBack { .. })),
        "expected TakenBack, got {r:?}"
    );
    assert!(
        took < 1.5,
        "the wait ended {took:.3} s in, not soon after 0.2 s"
    );
    assert!(
        long.write_counts().iter().all(|&c| c == 0),
        "a taken-back chunk wrote outputs"
    );

    // Still flagged, the next chunk is taken back while the stream is busy
    // with the last one's work, without waiting for it.
    let mut next = Synthetic::new(100_003, 200);
    let (r, took) = run_whole(&mut w, &mut next);
    assert!(
        matches!(r, Err(KernelError::TakenBack { .. })) && took < 0.5,
        "a busy stream's next chunk: {r:?} after {took:.3} s"
    );

    // Cleared, the stream waits for that work, then runs on, exactly once.
    flags[0].store(false, Ordering::Release);
    let (r, took) = run_whole(&mut w, &mut next);
    say(&format!(
        "{test}: the next chunk ran after {took:.3} s: {r:?}"
    ));
    r.unwrap();
    next.verify().unwrap();

    // Taken back again; `wait_idle` (what a runtime worker calls before it
    // looks for a chunk) is what waits for the abandoned work this time.
    let mut again = Synthetic::new(n, work);
    flags[0].store(true, Ordering::Release);
    let (r, took) = run_whole(&mut w, &mut again);
    assert!(
        matches!(r, Err(KernelError::TakenBack { .. })) && took < 0.5,
        "flagged from the start: {r:?} after {took:.3} s"
    );
    flags[0].store(false, Ordering::Release);
    let t = Instant::now();
    w.wait_idle();
    let idle = t.elapsed().as_secs_f64();
    let mut last = Synthetic::new(100_003, 200);
    let (r, took) = run_whole(&mut w, &mut last);
    say(&format!(
        "{test}: wait_idle took {idle:.3} s, the chunk after it {took:.3} s"
    ));
    r.unwrap();
    last.verify().unwrap();
    assert!(
        idle > 1.0,
        "wait_idle returned after {idle:.3} s, before the ~3 s of abandoned work"
    );

    // A kernel's setup is never taken back: the mlp's (compiling, opening
    // cuBLAS, a warm-up GEMM it waits for) passes with the flag set.
    let weights = Arc::new(MlpWeights::load(model_file("digits_mlp.safetensors")).unwrap());
    let split = LabeledRows::load(model_file("digits_test.safetensors")).unwrap();
    let mlp = Mlp::new(weights, split.x.clone()).unwrap();
    flags[0].store(true, Ordering::Release);
    w.prepare(&mlp).expect("setup is not taken back");
    w.begin_run(&mlp)
        .expect("a run's uploads are not taken back");
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn matmul_cuda_equals_cpu() {
    let test = "matmul_cuda_equals_cpu";
    let Some(mut ws) = workers(test) else { return };
    // The paper's 100×100, and an odd size that leaves partial tiles.
    for (count, dim) in [(300, 100), (97, 37)] {
        let p = MatmulProblem::new(count, dim).unwrap().with_seed(3);
        let cpu = run_sequential(MatmulJob::new(p).unwrap()).unwrap();
        let Some(gpu) = run_workload_gpu(test, &mut ws, MatmulJob::new(p).unwrap()) else {
            return;
        };
        assert_eq!(
            first_diff(&bits(&gpu.c), &bits(&cpu.c)),
            None,
            "{count}×{dim}²"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn pathfinder_cuda_equals_cpu() {
    let test = "pathfinder_cuda_equals_cpu";
    let Some(mut ws) = workers(test) else { return };
    // Pyramid heights: the default, 1, one that needs the wide tile, one
    // that needs two passes per run.
    for (cols, rows, h) in [
        (100_000, 100, 20),
        (5_000, 9, 1),
        (20_000, 400, 300),
        (30_000, 1_100, 1_000),
    ] {
        let p = PathfinderProblem::new(cols, rows)
            .unwrap()
            .with_pyramid(h)
            .unwrap();
        let cpu = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
        let Some(gpu) = run_workload_gpu(test, &mut ws, PathfinderJob::new(p).unwrap()) else {
            return;
        };
        assert_eq!(first_diff(&gpu.row, &cpu.row), None, "{cols}×{rows} h={h}");
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn nbody_cuda_equals_cpu() {
    let test = "nbody_cuda_equals_cpu";
    let Some(mut ws) = workers(test) else { return };
    for (n, steps) in [(4_099, 3), (300, 2)] {
        let p = NbodyProblem::new(n, steps).unwrap();
        let cpu = run_sequential(NbodyJob::new(p).unwrap()).unwrap().bodies;
        let Some(gpu) = run_workload_gpu(test, &mut ws, NbodyJob::new(p).unwrap()) else {
            return;
        };
        let gpu = gpu.bodies;
        for (name, g, c) in [
            ("x", &gpu.x, &cpu.x),
            ("y", &gpu.y, &cpu.y),
            ("z", &gpu.z, &cpu.z),
            ("vx", &gpu.vx, &cpu.vx),
            ("vy", &gpu.vy, &cpu.vy),
            ("vz", &gpu.vz, &cpu.vz),
        ] {
            assert_eq!(first_diff(&bits(g), &bits(c)), None, "{name} of {n} bodies");
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn kmeans_cuda_equals_cpu() {
    let test = "kmeans_cuda_equals_cpu";
    let Some(mut ws) = workers(test) else { return };
    // Blobs around a few centres, from a fixed generator; a partial last block.
    let (n, f) = (50_003usize, 34usize);
    let mut z = 0x1234_5678u64;
    let mut next = || {
        z = z
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((z >> 40) as f32) / (1u64 << 24) as f32
    };
    let values: Vec<f32> = (0..n * f)
        .map(|e| (e / f % 7) as f32 * 3.0 + next())
        .collect();
    for (k, block) in [(5, 1024), (13, 300)] {
        let data = std::sync::Arc::new(KmeansData::from_values(n, f, values.clone()).unwrap());
        let cfg = KmeansConfig::new(k, 0.001)
            .unwrap()
            .with_block(block)
            .unwrap();
        let cpu = run_sequential(KmeansJob::new(data.clone(), cfg).unwrap()).unwrap();
        let Some(gpu) = run_workload_gpu(test, &mut ws, KmeansJob::new(data, cfg).unwrap()) else {
            return;
        };
        assert_eq!(gpu.iterations, cpu.iterations, "k={k}");
        assert_eq!(first_diff(&gpu.membership, &cpu.membership), None, "k={k}");
        assert_eq!(
            first_diff(&bits(&gpu.centres), &bits(&cpu.centres)),
            None,
            "k={k}"
        );
    }
}

/// `examples/models/<file>`: beside this crate where it was built, or under
/// the working directory (the GPU machine runs the binary from a copy of the
/// repository elsewhere).
fn model_file(file: &str) -> PathBuf {
    let built = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../examples/models")
        .join(file);
    if built.exists() {
        built
    } else {
        PathBuf::from("examples/models").join(file)
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn mlp_cuda_matches_cpu() {
    let test = "mlp_cuda_matches_cpu";
    let Some(mut ws) = workers(test) else { return };
    // The digits model (64 → 1024 → 1024 → 10) and the wine model (13 → 48
    // → 24 → 12 → 3: another depth, the hidden slots ping-ponging three
    // times).
    for name in ["digits", "wine"] {
        if !mlp_matches(test, &mut ws, name) {
            return;
        }
    }
}

/// The committed model `name` on the GPU against the CPU; false when the
/// GPU run was skipped.
fn mlp_matches(test: &str, ws: &mut [StreamWorker; 2], name: &str) -> bool {
    let weights =
        Arc::new(MlpWeights::load(model_file(&format!("{name}_mlp.safetensors"))).unwrap());
    let split = LabeledRows::load(model_file(&format!("{name}_test.safetensors"))).unwrap();
    let c = weights.classes();
    // The test split as one batch, and repeated 41 times (14,760 digits
    // rows) so that the largest chunks pass one piece of the twin (4096
    // rows at 1024 units) and run in several pieces.
    let rows = split.rows();
    let big: Vec<f32> = split
        .x
        .iter()
        .copied()
        .cycle()
        .take(rows * 41 * split.features)
        .collect();
    for x in [split.x.clone(), big] {
        let n = x.len() / split.features;
        let cpu = run_sequential(OneShot::new(Mlp::new(weights.clone(), x.clone()).unwrap()))
            .unwrap()
            .expect("absorbed")
            .into_probs();
        let mut k = Mlp::new(weights.clone(), x).unwrap();
        let t = std::time::Instant::now();
        if !run_gpu(test, ws, &mut k).unwrap() {
            return false;
        }
        let elapsed = t.elapsed();
        let gpu = k.into_probs();
        let worst = cpu
            .iter()
            .zip(&gpu)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f32, f32::max);
        let labels =
            |p: &[f32]| -> Vec<usize> { p.chunks(c).map(|r| argmax(r).unwrap()).collect() };
        let (lc, lg) = (labels(&cpu), labels(&gpu));
        let differ = lc.iter().zip(&lg).filter(|(a, b)| a != b).count();
        let correct = |l: &[usize]| {
            l.iter()
                .zip(split.labels.iter().cycle())
                .filter(|&(&p, &y)| p as i64 == y)
                .count()
        };
        say(&format!(
            "{test}: {name}, {n} rows: max |gpu - cpu| {worst:.2e}, labels differing {differ}, \
             correct cpu {} gpu {}, {elapsed:?} on the GPU (two streams, uneven chunks)",
            correct(&lc),
            correct(&lg)
        ));
        assert!(
            worst <= 1e-5,
            "{name}, {n} rows: probabilities differ by {worst}"
        );
        assert_eq!(differ, 0, "{name}, {n} rows: labels differ");
        assert!(gpu.iter().all(|p| p.is_finite()));
    }
    true
}

/// Blobs around a few centres, from a fixed generator: `n` points of `f`
/// features.
fn blobs(n: usize, f: usize) -> Vec<f32> {
    let mut z = 0x1234_5678u64;
    let mut next = || {
        z = z
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((z >> 40) as f32) / (1u64 << 24) as f32
    };
    (0..n * f)
        .map(|e| (e / f % 7) as f32 * 3.0 + next())
        .collect()
}

/// What matmul, pathfinder and kmeans give on the GPU with both streams set
/// to `pinned`, at sizes whose buffers are large enough to be page-locked.
fn transfer_bound_results(test: &str, pinned: bool) -> Option<(Vec<u32>, Vec<i32>, Vec<i32>)> {
    let mut ws = workers(test)?;
    for w in &mut ws {
        w.set_host_pinning(if pinned {
            cuda::HostPinning::All
        } else {
            cuda::HostPinning::Off
        });
    }
    let mp = MatmulProblem::new(300, 100).unwrap().with_seed(3);
    let m = run_workload_gpu(test, &mut ws, MatmulJob::new(mp).unwrap())?;
    // Rows of 1.6 MB: page-locked, and turned from input into output in
    // place from run to run; a grid of 24 MB read by 2-D copies.
    let pp = PathfinderProblem::new(400_000, 61).unwrap();
    let p = run_workload_gpu(test, &mut ws, PathfinderJob::new(pp).unwrap())?;
    // Memberships of 1.2 MB and partial sums of 2 MB, page-locked, both
    // ways every run.
    let data = Arc::new(KmeansData::from_values(300_000, 8, blobs(300_000, 8)).unwrap());
    let cfg = KmeansConfig::new(13, 0.001)
        .unwrap()
        .with_block(64)
        .unwrap();
    let k = run_workload_gpu(test, &mut ws, KmeansJob::new(data, cfg).unwrap())?;
    let mut kk = k.membership.clone();
    kk.extend(k.centres.iter().map(|c| c.to_bits() as i32));
    Some((bits(&m.c), p.row, kk))
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn pinned_and_staged_copies_agree_bit_for_bit() {
    let test = "pinned_and_staged_copies_agree_bit_for_bit";
    let Some(staged) = transfer_bound_results(test, false) else {
        return;
    };
    let mid = cuda::host_pin_stats();
    let Some(pinned) = transfer_bound_results(test, true) else {
        return;
    };
    let after = cuda::host_pin_stats();
    say(&format!(
        "{test}: page-locked {} buffers, {:.1} MB in {:.2} ms ({:.2} ms unlocking); refused {}{}",
        after.locked - mid.locked,
        (after.locked_bytes - mid.locked_bytes) as f64 / 1e6,
        (after.lock_secs - mid.lock_secs) * 1e3,
        (after.unlock_secs - mid.unlock_secs) * 1e3,
        after.refused - mid.refused,
        after
            .last_refusal
            .as_deref()
            .map(|w| format!(" (last: {w})"))
            .unwrap_or_default(),
    ));
    // matmul a, b, c; pathfinder grid and two rows; kmeans memberships and
    // sums (each job's buffers once, whatever the number of runs).
    assert_eq!(first_diff(&pinned.0, &staged.0), None, "matmul");
    assert_eq!(first_diff(&pinned.1, &staged.1), None, "pathfinder");
    assert_eq!(first_diff(&pinned.2, &staged.2), None, "kmeans");
    assert!(
        after.locked - mid.locked >= 8,
        "the pinned path page-locked only {} buffers",
        after.locked - mid.locked
    );
    // And the CPU's, once (the other tests compare the pinned path at
    // their sizes).
    let cpu =
        run_sequential(PathfinderJob::new(PathfinderProblem::new(400_000, 61).unwrap()).unwrap())
            .unwrap();
    assert_eq!(first_diff(&pinned.1, &cpu.row), None, "pathfinder vs CPU");
}

/// Runs all of `k` as one chunk on `w`, the run started as the runtime
/// starts it; seconds in `begin_run` (page-locking) and in the chunk.
fn run_timed(w: &mut StreamWorker, k: &mut Matmul) -> (f64, f64) {
    let n = k.items();
    let (k, chunks) = claim_parts(k, &[0, n]);
    w.prepare(k).expect("prepare");
    let t = Instant::now();
    w.begin_run(k).expect("begin_run");
    let stage = t.elapsed().as_secs_f64();
    let t = Instant::now();
    w.run(k, &chunks[0]).expect("chunk");
    (stage, t.elapsed().as_secs_f64())
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn matmul_pinned_chunks_copy_at_dma_speed() {
    let test = "matmul_pinned_chunks_copy_at_dma_speed";
    let Some([mut w, w1]) = workers(test) else {
        return;
    };
    // One stream, one chunk of 6000 products: 0.48 GB in, 0.24 GB out, in
    // 32 MiB pieces (in, multiply, out, one after the other).
    let p = MatmulProblem::new(6000, 100).unwrap();
    let gb = |items: usize| (items * 100 * 100 * 4) as f64 / 1e9;
    let (inb, outb) = (2.0 * gb(6000), gb(6000));
    let mut outs = Vec::new();
    for pinned in [false, true] {
        w.set_host_pinning(if pinned {
            cuda::HostPinning::All
        } else {
            cuda::HostPinning::Off
        });
        let mut k = Matmul::new(p).unwrap();
        let (stage, first) = run_timed(&mut w, &mut k);
        // Again, warm: the same buffers, still page-locked.
        let (_, chunk) = run_timed(&mut w, &mut k);
        say(&format!(
            "{test}: {}: 6000×100² in one chunk on one stream: {:.1} ms (first {:.1} ms); \
             H2D {inb:.2} GB → {:.1} GB/s of the chunk's time, in+out {:.2} GB → {:.1} GB/s; \
             begin_run {:.1} ms",
            if pinned { "pinned" } else { "staged" },
            chunk * 1e3,
            first * 1e3,
            inb / chunk,
            inb + outb,
            (inb + outb) / chunk,
            stage * 1e3,
        ));
        outs.push(k.into_output());
    }
    assert_eq!(
        first_diff(&bits(&outs[0]), &bits(&outs[1])),
        None,
        "6000 products"
    );
    drop(outs);

    // The benchmark's size, the GPU alone on two streams: 3.6 GB over the
    // bus, 46 ms at 52 GB/s (the H100's pinned rate; 55 GB/s on an H200).
    let mut ws = [w, w1];
    let n = 30_000;
    let cuts: Vec<usize> = (0..=16).map(|i| i * n / 16).collect();
    let p = MatmulProblem::new(n, 100).unwrap();
    let mut outs = Vec::new();
    for pinned in [false, true] {
        for w in &mut ws {
            w.set_host_pinning(if pinned {
                cuda::HostPinning::All
            } else {
                cuda::HostPinning::Off
            });
        }
        let before = cuda::host_pin_stats();
        let mut k = Matmul::new(p).unwrap();
        let t = Instant::now();
        assert!(run_cuts(test, &mut ws, &mut k, &cuts).unwrap());
        let all = t.elapsed().as_secs_f64();
        let lock = cuda::host_pin_stats().lock_secs - before.lock_secs;
        let t = Instant::now();
        let c = k.into_output();
        let unlock = t.elapsed().as_secs_f64();
        let run = all - lock;
        say(&format!(
            "{test}: {}: {n}×100² on two streams, 16 chunks: {:.1} ms, of which page-locking \
             {:.1} ms; without it {:.1} ms: H2D {:.2} GB → {:.1} GB/s, {:.1}× the 46 ms bus \
             floor; unlocking {:.1} ms",
            if pinned { "pinned" } else { "staged" },
            all * 1e3,
            lock * 1e3,
            run * 1e3,
            2.0 * gb(n),
            2.0 * gb(n) / run,
            run / 0.046,
            unlock * 1e3,
        ));
        outs.push(c);
    }
    assert_eq!(
        first_diff(&bits(&outs[0]), &bits(&outs[1])),
        None,
        "{n} products"
    );
}

mod declared {
    //! A twin declared through the public API ([`coexec_kernels::GpuTwin`]):
    //! a run input, an item input of stride 2, an output, a per-block
    //! output and two scalars, against its CPU code.

    use coexec_kernels::{
        Chunk, CudaSource, DisjointBuf, GpuTwin, Kernel, KernelError, Twin, TwinInput,
    };

    const SOURCE: CudaSource = CudaSource::new(
        "twin_check.cu",
        r#"extern "C" __global__ void twin_check(unsigned long long lo, unsigned int n,
            const float* coef, const float* x, float* y, unsigned long long* sums,
            unsigned int grain, float s) {
            unsigned int i = blockIdx.x * blockDim.x + threadIdx.x;
            if (i >= n) return;
            y[i] = coef[0] * x[2 * i] + coef[1] * x[2 * i + 1] + coef[2] + s;
            if (i % grain == 0) {
                unsigned long long acc = 0;
                for (unsigned int j = i; j < i + grain && j < n; j++) acc += (lo + j) * (lo + j);
                sums[i / grain] = acc;
            }
        }"#,
    );

    pub(super) const GRAIN: usize = 64;

    pub(super) struct Check {
        pub(super) coef: TwinInput<f32>,
        pub(super) x: TwinInput<f32>,
        pub(super) s: f32,
        pub(super) y: DisjointBuf<f32>,
        pub(super) sums: DisjointBuf<u64>,
    }

    impl Check {
        pub(super) fn new(n: usize) -> Self {
            Self {
                coef: TwinInput::new(vec![0.5, -1.25, 3.0]),
                x: TwinInput::new((0..2 * n).map(|i| (i as f32).sin() * 100.0).collect()),
                s: 0.1,
                y: DisjointBuf::new(n, 1),
                sums: DisjointBuf::new(n.div_ceil(GRAIN), 1),
            }
        }
    }

    impl Kernel for Check {
        fn name(&self) -> &str {
            "twin_check"
        }
        fn items(&self) -> usize {
            self.y.items()
        }
        fn grain(&self) -> usize {
            GRAIN
        }
        fn run_cpu(&self, c: &Chunk) -> Result<(), KernelError> {
            let (k, x) = (&self.coef, &self.x);
            for (y, i) in self.y.chunk_mut(c).iter_mut().zip(c.range()) {
                *y = k[0] * x[2 * i] + k[1] * x[2 * i + 1] + k[2] + self.s;
            }
            let sums = self.sums.chunk_mut_blocks(c, GRAIN);
            for (b, s) in sums.iter_mut().enumerate() {
                let lo = c.lo() + b * GRAIN;
                *s = (lo..(lo + GRAIN).min(c.hi())).map(|j| (j * j) as u64).sum();
            }
            Ok(())
        }
        fn cuda(&self) -> Option<&dyn coexec_kernels::cuda::CudaKernel> {
            Some(self)
        }
    }

    impl GpuTwin for Check {
        fn twin(&self) -> Twin<'_> {
            Twin::new(&SOURCE, "twin_check")
                .run_input(&self.coef)
                .item_input(&self.x, 2)
                .output(&self.y)
                .block_output(&self.sums)
                .scalar(GRAIN as u32)
                .scalar(self.s)
        }
    }

    /// `Check` declared wrongly: without its last scalar (`Fewer`), or
    /// with it as an `f64` where the kernel takes a `float` (`Wider`).
    pub(super) struct Mismatched(pub(super) Check, pub(super) bool);

    impl Kernel for Mismatched {
        fn name(&self) -> &str {
            "twin_check_mismatched"
        }
        fn items(&self) -> usize {
            self.0.items()
        }
        fn grain(&self) -> usize {
            GRAIN
        }
        fn run_cpu(&self, c: &Chunk) -> Result<(), KernelError> {
            self.0.run_cpu(c)
        }
        fn cuda(&self) -> Option<&dyn coexec_kernels::cuda::CudaKernel> {
            Some(self)
        }
    }

    impl GpuTwin for Mismatched {
        fn twin(&self) -> Twin<'_> {
            let c = &self.0;
            let t = Twin::new(&SOURCE, "twin_check")
                .run_input(&c.coef)
                .item_input(&c.x, 2)
                .output(&c.y)
                .block_output(&c.sums)
                .scalar(GRAIN as u32);
            if self.1 { t.scalar(c.s as f64) } else { t }
        }
    }
}

/// A twin whose declaration differs from its kernel's parameters, in
/// count or in a size, gets an error naming the parameter and never
/// launches (the driver would read past the argument array).
#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn a_mismatched_twin_is_refused_before_launch() {
    let test = "a_mismatched_twin_is_refused_before_launch";
    let Some(mut ws) = workers(test) else { return };
    for (wider, want) in [
        (false, "takes 8 parameters, the twin passes 7"),
        (true, "parameter 7 takes 4 bytes, the twin passes 8"),
    ] {
        let mut k = declared::Mismatched(declared::Check::new(1000), wider);
        match run_gpu(test, &mut ws, &mut k) {
            Err(e) => assert!(e.to_string().contains(want), "{e}"),
            Ok(_) => panic!("a mismatched twin ran"),
        }
        assert!(
            k.0.y.as_slice().iter().all(|&y| y == 0.0),
            "nothing was written"
        );
    }
}

#[test]
#[ignore = "needs a CUDA GPU: run with --include-ignored where one is present"]
fn a_declared_twin_equals_cpu() {
    let test = "a_declared_twin_equals_cpu";
    let Some(mut ws) = workers(test) else { return };
    let n = 100_000;
    let mut cpu = declared::Check::new(n);
    coexec_kernels::with_chunk(&mut cpu, 0..n, |k, c| k.run_cpu(c)).unwrap();
    let mut gpu = declared::Check::new(n);
    assert!(run_gpu(test, &mut ws, &mut gpu).unwrap());
    assert_eq!(
        first_diff(&bits(gpu.y.as_slice()), &bits(cpu.y.as_slice())),
        None
    );
    assert_eq!(first_diff(gpu.sums.as_slice(), cpu.sums.as_slice()), None);
}
