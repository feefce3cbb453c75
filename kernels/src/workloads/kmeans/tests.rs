use super::super::rng::{stream, sym_unit_f32};
use super::super::run_sequential;
use super::super::testutil::{run_workload_split, splits};
use super::input::atof;
use super::*;
use crate::KernelError;
use proptest::prelude::*;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// Where the Rodinia inputs are: `COEXEC_KMEANS_DATA`, else
/// `shared/data/rodinia-kmeans` beside the repository.
fn data_dir() -> PathBuf {
    std::env::var_os("COEXEC_KMEANS_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../shared/data/rodinia-kmeans"
            ))
        })
}

#[test]
fn generated_input_is_deterministic_clustered_and_in_range() {
    let a = KmeansData::generated(5000, 34, 7).unwrap();
    let b = KmeansData::generated(5000, 34, 7).unwrap();
    assert_eq!((a.points(), a.features()), (5000, 34));
    assert!(
        a.values()
            .iter()
            .zip(b.values())
            .all(|(x, y)| x.to_bits() == y.to_bits())
    );
    let c = KmeansData::generated(5000, 34, 8).unwrap();
    assert_ne!(a.values(), c.values());
    for i in 0..a.points() {
        for (j, &v) in a.point(i).iter().enumerate() {
            let hi = match j {
                0 => 1000.0,
                1 | 2 => 5000.0,
                3..=15 => 4.0,
                16 | 17 => 511.0,
                25 | 26 => 255.0,
                _ => 1.0,
            };
            assert!((0.0..=hi).contains(&v) && v.is_finite(), "{i},{j}: {v}");
        }
    }
    // Points of one blob lie near each other: kmeans converges.
    let got = run_sequential(KmeansJob::new(a, KmeansConfig::default()).unwrap()).unwrap();
    assert!(got.iterations < 100, "{} iterations", got.iterations);
    let kdd = KmeansData::generated_kdd_shape().unwrap();
    assert_eq!((kdd.points(), kdd.features()), (494_020, 34));
}

/// Rodinia's `kmeans_clustering`, single thread, written out plainly.
#[allow(clippy::needless_range_loop)]
fn reference(data: &KmeansData, k: usize, threshold: f32) -> (Vec<f32>, usize, Vec<i32>) {
    let (n, f) = (data.points(), data.features());
    let mut clusters: Vec<f32> = data.values()[..k * f].to_vec();
    let mut membership = vec![-1i32; n];
    let mut loops = 0;
    let mut iterations = 0;
    loop {
        let mut delta = 0.0f32;
        let mut new_len = vec![0i32; k];
        let mut new_c = vec![0.0f32; k * f];
        for i in 0..n {
            let pt = data.point(i);
            let mut min = f32::MAX;
            let mut index = 0;
            for c in 0..k {
                let mut ans = 0.0f32;
                for j in 0..f {
                    ans += (pt[j] - clusters[c * f + j]) * (pt[j] - clusters[c * f + j]);
                }
                if ans < min {
                    min = ans;
                    index = c;
                }
            }
            if membership[i] != index as i32 {
                delta += 1.0;
            }
            membership[i] = index as i32;
            new_len[index] += 1;
            for j in 0..f {
                new_c[index * f + j] += pt[j];
            }
        }
        for c in 0..k {
            for j in 0..f {
                if new_len[c] > 0 {
                    clusters[c * f + j] = new_c[c * f + j] / new_len[c] as f32;
                }
            }
        }
        iterations += 1;
        let go = delta > threshold && {
            let l = loops;
            loops += 1;
            l < 500
        };
        if !go {
            break;
        }
    }
    (clusters, iterations, membership)
}

/// `n` points around `k` well separated centres, from `seed`.
fn blobs(n: usize, f: usize, k: usize, seed: u64) -> KmeansData {
    let mut v = Vec::with_capacity(n * f);
    for i in 0..n {
        let c = (stream(seed, 9, i as u64) % k as u64) as f32;
        for j in 0..f {
            v.push(c * 10.0 + sym_unit_f32(stream(seed, 10, (i * f + j) as u64)) * 3.0);
        }
    }
    KmeansData::from_values(n, f, v).unwrap()
}

fn temp_file(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("coexec-kmeans-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn atof_reads_like_c() {
    let cases: &[(&str, f32)] = &[
        ("1.5", 1.5),
        ("-2", -2.0),
        ("+3", 3.0),
        ("1e3", 1000.0),
        ("1e", 1.0),
        ("1e+", 1.0),
        ("2.5E-1x", 0.25),
        (".5", 0.5),
        ("5.", 5.0),
        ("1.2.3", 1.2),
        ("0.00", 0.0),
        ("00", 0.0),
        ("tcp", 0.0),
        ("", 0.0),
        ("-", 0.0),
        (".", 0.0),
        ("0x10", 16.0),
        ("0x1.8p1", 3.0),
        ("0x", 0.0),
        ("0xg", 0.0),
        ("1e400", f32::INFINITY),
        ("-1e400", f32::NEG_INFINITY),
        ("1e-50", 0.0),
        ("inf", f32::INFINITY),
        ("-Infinity", f32::NEG_INFINITY),
        ("  7", 7.0),
        ("0.1", 0.1),
        ("3.4028235e38", f32::MAX),
        ("123456789012345678901234567890", 1.2345679e29),
        ("0.000000000000000000000000000001234", 1.234e-30),
        ("18347", 18347.0),
    ];
    for &(s, want) in cases {
        assert_eq!(atof(s.as_bytes()).to_bits(), want.to_bits(), "atof({s:?})");
    }
    assert!(atof(b"nan").is_nan() && atof(b"-NaN(1)").is_nan());
    assert_eq!(atof(b"-0").to_bits(), (-0.0f32).to_bits());
    // Double rounding through f64, as (float)strtod does.
    for s in [
        "0.1",
        "1.0000000596046448",
        "3.14159265358979",
        "2.2250738585072014e-308",
    ] {
        assert_eq!(atof(s.as_bytes()), s.parse::<f64>().unwrap() as f32, "{s}");
    }
}

#[test]
fn parses_rodinia_text_and_tcp_tokens() {
    // Rodinia ends the id at a space or tab only: `2,3,4,5` is one id
    // with no features, so its line is ragged.
    let text = b"1 0 1.5 2\n\n2,3,4,5\n";
    let e = KmeansData::parse(text, Path::new("t"))
        .unwrap_err()
        .to_string();
    assert!(e.starts_with("t:3:"), "{e}");
    let text = b"1 0 1.5 2\n7 3,4,5\n3\t0 tcp 7\r\n";
    let d = KmeansData::parse(text, Path::new("t")).unwrap();
    assert_eq!(d.values(), &[0.0, 1.5, 2.0, 3.0, 4.0, 5.0, 0.0, 0.0, 7.0]);
}

#[test]
fn bad_inputs_name_file_and_line() {
    let p = temp_file("ragged.txt", b"1 1 2 3\n2 4 5 6\n3 7 8\n");
    let e = KmeansData::read(&p).unwrap_err().to_string();
    assert!(
        e.contains("ragged.txt:3:") && e.contains("2 features"),
        "{e}"
    );
    let p = temp_file("empty.txt", b"\n  \n");
    let e = KmeansData::read(&p).unwrap_err().to_string();
    assert!(e.contains("empty.txt:0:") && e.contains("empty"), "{e}");
    let p = temp_file("noid.txt", b"17\n");
    assert!(
        KmeansData::read(&p)
            .unwrap_err()
            .to_string()
            .contains("noid.txt:1:")
    );
    let e = KmeansData::read(std::env::temp_dir().join("coexec-absent-dir/nope")).unwrap_err();
    assert!(matches!(e, KernelError::Io { .. }));
    // A truncated xz file.
    let mut xz = Vec::new();
    {
        use std::io::Write;
        let mut enc = xz2::write::XzEncoder::new(&mut xz, 6);
        for i in 0..2000 {
            writeln!(enc, "{i} {} {}", i % 7, i % 3).unwrap();
        }
        enc.finish().unwrap();
    }
    let whole = temp_file("ok.xz", &xz);
    assert_eq!(KmeansData::read(&whole).unwrap().points(), 2000);
    let cut = temp_file("cut.xz", &xz[..xz.len() / 2]);
    let e = KmeansData::read(&cut).unwrap_err().to_string();
    assert!(e.contains("cut.xz:0:") && e.contains("xz"), "{e}");
    // A text file cut mid-line.
    let cutline = temp_file("cutline.txt", b"1 1 2 3\n2 4 5 6\n3 7");
    assert!(
        KmeansData::read(&cutline)
            .unwrap_err()
            .to_string()
            .contains("cutline.txt:3:")
    );
    // More clusters than points.
    let small = KmeansData::read(temp_file("two.txt", b"1 1 2\n2 3 4\n")).unwrap();
    let e = KmeansJob::new(small, KmeansConfig::default())
        .unwrap_err()
        .to_string();
    assert!(e.contains("two.txt:0:") && e.contains("5 clusters"), "{e}");
}

#[test]
fn refuses_bad_configs() {
    assert!(KmeansConfig::new(0, 0.001).is_err());
    assert!(KmeansConfig::new(5, f32::NAN).is_err());
    assert!(KmeansConfig::default().with_block(0).is_err());
    assert!(KmeansData::from_values(0, 3, vec![]).is_err());
    assert!(KmeansData::from_values(2, 3, vec![0.0; 5]).is_err());
}

#[test]
fn one_block_is_rodinia_bit_for_bit() {
    for (k, seed) in [(1, 1), (3, 2), (5, 3), (11, 4)] {
        let d = blobs(700, 6, 4, seed);
        let (want, iters, member) = reference(&d, k, 0.001);
        let cfg = KmeansConfig::new(k, 0.001)
            .unwrap()
            .with_block(1024)
            .unwrap();
        let got = run_sequential(KmeansJob::new(d, cfg).unwrap()).unwrap();
        assert_eq!(got.iterations, iters);
        assert_eq!(got.membership, member);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&got.centres), bits(&want), "k={k}");
    }
}

#[test]
fn many_blocks_close_to_rodinia() {
    // Block sums reassociate the per-cluster f32 sums: relative error of
    // 3000-term sums of values ≤ 33 in magnitude stays below 1e-5.
    let d = blobs(3000, 5, 3, 7);
    let (want, iters, member) = reference(&d, 3, 0.001);
    let cfg = KmeansConfig::new(3, 0.001).unwrap().with_block(64).unwrap();
    let got = run_sequential(KmeansJob::new(d, cfg).unwrap()).unwrap();
    assert_eq!(got.iterations, iters);
    assert_eq!(got.membership, member);
    for (a, b) in got.centres.iter().zip(&want) {
        assert!((a - b).abs() / b.abs().max(1.0) < 1e-5, "{a} vs {b}");
    }
}

/// Rodinia 3.1 openmp kmeans (`-k 5 -t 0.001`, one thread) on the `100`
/// file: 8 iterations and these centres, printed with `%.9g`.
const RODINIA_100: &str = include_str!("../../../tests/fixtures/rodinia_kmeans_100.txt");

/// Rodinia's iteration count and centres from a fixture (`iterations N`
/// then one `k: values…` line per centre).
pub(super) fn fixture(text: &str) -> (usize, Vec<f32>) {
    let mut iters = 0;
    let mut centres = Vec::new();
    for line in text.lines() {
        if let Some(n) = line.strip_prefix("iterations ") {
            iters = n.trim().parse().unwrap();
        } else if let Some((_, vals)) = line.split_once(": ") {
            centres.extend(vals.split_whitespace().map(|v| v.parse::<f32>().unwrap()));
        }
    }
    (iters, centres)
}

#[test]
#[ignore = "needs ../shared/data/rodinia-kmeans (or COEXEC_KMEANS_DATA), outside the repository: .ci/run runs it"]
fn rodinia_100_file() {
    let path = data_dir().join("100");
    let d = KmeansData::read(&path).unwrap();
    assert_eq!((d.points(), d.features()), (100, 34));
    let (want, iters, member) = reference(&d, 5, 0.001);
    let got = run_sequential(KmeansJob::new(d, KmeansConfig::default()).unwrap()).unwrap();
    assert_eq!((got.iterations, &got.membership), (iters, &member));
    assert_eq!(got.centres, want);
    let (r_iters, r_centres) = fixture(RODINIA_100);
    assert_eq!(got.iterations, r_iters);
    assert_eq!(got.centres, r_centres);
}

/// The real inputs against Rodinia's own single-thread results (5 s in
/// release: `cargo test --release -p coexec-kernels --features workloads --lib -- --ignored rodinia`).
#[test]
#[ignore = "needs ../shared/data/rodinia-kmeans (or COEXEC_KMEANS_DATA), outside the repository: .ci/run runs it"]
fn rodinia_real_files() {
    for (file, fixture_text) in [
        (
            "204800.txt.xz",
            include_str!("../../../tests/fixtures/rodinia_kmeans_204800.txt"),
        ),
        (
            "819200.txt.xz",
            include_str!("../../../tests/fixtures/rodinia_kmeans_819200.txt"),
        ),
        (
            "kdd_cup.xz",
            include_str!("../../../tests/fixtures/rodinia_kmeans_kdd_cup.txt"),
        ),
    ] {
        let t = std::time::Instant::now();
        let d = Arc::new(KmeansData::read(data_dir().join(file)).unwrap());
        let load = t.elapsed();
        let (iters, want) = fixture(fixture_text);
        let worst = |got: &[f32]| {
            got.iter()
                .zip(&want)
                .map(|(a, b)| ((a - b).abs() / b.abs().max(1.0)) as f64)
                .fold(0.0, f64::max)
        };
        // One block is Rodinia's single-thread summation order: bit for bit.
        let one = KmeansConfig::default().with_block(d.points()).unwrap();
        let got = run_sequential(KmeansJob::new(d.clone(), one).unwrap()).unwrap();
        assert_eq!(got.iterations, iters, "{file}, one block");
        assert_eq!(got.centres, want, "{file}, one block");
        // Blocks of 1024 reassociate the sums.
        let t = std::time::Instant::now();
        let dd = d.clone();
        let got = run_sequential(KmeansJob::new(d, KmeansConfig::default()).unwrap()).unwrap();
        let run = t.elapsed();
        // Which is nearer the exact means of the final clusters (f64)?
        let (k, f) = (got.clusters, got.features);
        let mut exact = vec![0.0f64; k * f];
        let mut n = vec![0usize; k];
        for (i, &m) in got.membership.iter().enumerate() {
            n[m as usize] += 1;
            for j in 0..f {
                exact[m as usize * f + j] += dd.point(i)[j] as f64;
            }
        }
        let off = |c: &[f32]| {
            (0..k * f)
                .map(|e| {
                    (c[e] as f64 - exact[e] / n[e / f] as f64).abs()
                        / (exact[e] / n[e / f] as f64).abs().max(1.0)
                })
                .fold(0.0, f64::max)
        };
        eprintln!(
            "{file}: load {load:?}; blocks of 1024: {} iterations (Rodinia {iters}) in {run:?}, \
             worst rel diff to Rodinia {:.3e}; vs f64 means: ours {:.3e}, Rodinia's {:.3e}",
            got.iterations,
            worst(&got.centres),
            off(&got.centres),
            off(&want),
        );
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(16))]
    #[test]
    fn any_split_is_bit_identical((cuts, seed) in splits(12), k in 1usize..10) {
        let d = Arc::new(blobs(2500, 3, 4, 99));
        let cfg = KmeansConfig::new(k, 0.001).unwrap().with_block(128).unwrap();
        let whole = run_sequential(KmeansJob::new(d.clone(), cfg).unwrap()).unwrap();
        let split = run_workload_split(KmeansJob::new(d, cfg).unwrap(), &cuts, seed).unwrap();
        prop_assert_eq!(whole.iterations, split.iterations);
        prop_assert_eq!(&whole.membership, &split.membership);
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        prop_assert_eq!(bits(&whole.centres), bits(&split.centres));
    }
}
