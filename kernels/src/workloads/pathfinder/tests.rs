use super::super::run_sequential;
use super::super::testutil::{run_workload_split, splits};
use super::*;
use proptest::prelude::*;

#[test]
fn jumped_equals_drawing() {
    let mut seq = GlibcRand::new(9);
    let mut drawn = 0u64;
    for n in [0u64, 1, 2, 3, 30, 31, 32, 100, 1000, 12_345, 70_000] {
        while drawn < n {
            seq.next_i32();
            drawn += 1;
        }
        let mut j = GlibcRand::new(9).jumped(n);
        let mut s = seq.clone();
        for _ in 0..100 {
            assert_eq!(s.next_i32(), j.next_i32(), "after {n} draws");
        }
    }
    // Jumps compose from any position.
    let mut a = GlibcRand::new(3).jumped(17).jumped(40);
    let mut b = GlibcRand::new(3).jumped(57);
    assert_eq!(a.next_i32(), b.next_i32());
}

#[test]
fn parallel_grid_equals_the_one_thread_loop() {
    // Sizes below, at and across the generation block, ragged ends.
    let block = super::super::rng::GEN_BLOCK;
    for (cols, rows) in [(1, 1), (7, 3), (1000, 1), (block / 10 + 3, 21), (333, 9000)] {
        let p = PathfinderProblem::new(cols, rows).unwrap();
        let job = PathfinderJob::new(p).unwrap();
        // The reference: the one-thread fill this crate used before.
        let mut g = GlibcRand::new(p.seed);
        assert_eq!(job.wall.len(), cols * rows);
        assert!(job.wall.iter().all(|&c| c == (g.next_i32() % 10) as u8));
    }
}

/// Rodinia's loop, one row at a time, from the same grid.
fn reference(p: PathfinderProblem) -> Vec<i32> {
    let mut g = GlibcRand::new(p.seed);
    let wall: Vec<i32> = (0..p.cols * p.rows).map(|_| g.next_i32() % 10).collect();
    let mut src: Vec<i32> = wall[..p.cols].to_vec();
    let mut dst = vec![0; p.cols];
    for t in 1..p.rows {
        for n in 0..p.cols {
            let mut m = src[n];
            if n > 0 {
                m = m.min(src[n - 1]);
            }
            if n + 1 < p.cols {
                m = m.min(src[n + 1]);
            }
            dst[n] = wall[t * p.cols + n] + m;
        }
        std::mem::swap(&mut src, &mut dst);
    }
    src
}

#[test]
fn glibc_rand_first_outputs_after_srand_9() {
    let mut g = GlibcRand::new(9);
    let first: Vec<i32> = (0..5).map(|_| g.next_i32()).collect();
    assert_eq!(
        first,
        [444454915, 1502197874, 436864165, 770686807, 1899516530]
    );
    // srand(1) is glibc's default state: rand() starts 1804289383, 846930886.
    let mut g = GlibcRand::new(1);
    assert_eq!((g.next_i32(), g.next_i32()), (1804289383, 846930886));
}

#[test]
fn matches_row_by_row_reference() {
    for (cols, rows, h) in [
        (1, 5, 3),
        (2, 7, 1),
        (37, 30, 4),
        (300, 41, 20),
        (9000, 12, 5),
    ] {
        let p = PathfinderProblem::new(cols, rows)
            .unwrap()
            .with_pyramid(h)
            .unwrap();
        let out = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
        assert_eq!(out.row, reference(p), "{cols}×{rows} h={h}");
    }
    let p = PathfinderProblem::new(5, 1).unwrap();
    assert_eq!(
        run_sequential(PathfinderJob::new(p).unwrap()).unwrap().row,
        reference(p)
    );
}

#[test]
fn rodinia_1000x10_row() {
    // First values of Rodinia 3.1 openmp `pathfinder 1000 10` (BENCH_PRINT).
    let p = PathfinderProblem::new(1000, 10).unwrap();
    let out = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
    let text = out.rodinia_text();
    assert!(text.starts_with("24 20 24 17 14 18 24 28 27 20 14 21 19 18 16 21 20 17 15 29 "));
    assert!(text.ends_with(" \n"));
}

#[test]
fn refuses_bad_sizes() {
    assert!(PathfinderProblem::new(0, 10).is_err());
    assert!(PathfinderProblem::new(10, 0).is_err());
    assert!(
        PathfinderProblem::new(10, 10)
            .unwrap()
            .with_pyramid(0)
            .is_err()
    );
    assert!(PathfinderProblem::new(1 << 40, 1 << 10).is_err());
    assert!(PathfinderProblem::new(1, 1 << 30).is_err());
}

/// SHA-256 of the result rows printed by Rodinia 3.1 openmp `pathfinder 100000 100`
/// and `pathfinder 1000000 100` (BENCH_PRINT, last line): 0.3 s in release, 6 s
/// in a debug build.
#[test]
fn rodinia_checksums() {
    for (cols, sha) in [
        (
            100_000,
            "d1ef70774261b081deeaf9d3406814c32112e9924599e1e0bcdc1a23fe9ec8de",
        ),
        (
            1_000_000,
            "187facab22d103c489459cb1a9318c167c17300e763c46f505be497a6bb03035",
        ),
    ] {
        let p = PathfinderProblem::new(cols, 100).unwrap();
        let out = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
        assert_eq!(out.sha256_hex(), sha, "{cols}×100");
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]
    #[test]
    fn any_split_is_bit_identical((cuts, seed) in splits(12), h in 1usize..9) {
        let p = PathfinderProblem::new(1500, 23).unwrap().with_pyramid(h).unwrap();
        let whole = run_sequential(PathfinderJob::new(p).unwrap()).unwrap();
        let split = run_workload_split(PathfinderJob::new(p).unwrap(), &cuts, seed).unwrap();
        prop_assert_eq!(whole.row, split.row);
    }
}
