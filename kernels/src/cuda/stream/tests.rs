use super::memory::{Pod, as_bytes};
use super::*;

use crate::Kernel;
use crate::workloads::{KmeansConfig, KmeansData, KmeansJob, NbodyJob, NbodyProblem, Workload};

/// The run cache's entry for `data` under `id`, as a stream's
/// `run_input` finds it: a fresh (empty) entry is one it uploads into.
fn entry<T: Pod>(cache: &RunCache, id: u64, data: &[T]) -> run_cache::Entry {
    cache.entry(RunKey::new(id, as_bytes(data)))
}

#[test]
fn a_run_input_is_found_by_its_owner_not_by_its_bytes() {
    let v = vec![1.0f32; 1000];
    // The same bytes under a new owner (the next run's input, changed or
    // not, at the same address): another key, so uploaded again.
    assert_ne!(RunKey::new(1, as_bytes(&v)), RunKey::new(2, as_bytes(&v)));
    assert_eq!(RunKey::new(1, as_bytes(&v)), RunKey::new(1, as_bytes(&v)));
    // Two inputs of one owner (nbody's x and y) are told apart by place.
    let w = vec![1.0f32; 1000];
    assert_ne!(RunKey::new(1, as_bytes(&v)), RunKey::new(1, as_bytes(&w)));
}

#[test]
fn kmeans_uploads_new_centres_every_run_and_its_points_once() {
    let n = 4096;
    let values: Vec<f32> = (0..n * 3).map(|e| (e % 97) as f32).collect();
    let data = Arc::new(KmeansData::from_values(n, 3, values).unwrap());
    let mut job = KmeansJob::new(data, KmeansConfig::new(4, 0.0).unwrap()).unwrap();
    let cache = RunCache::default();
    let mut seen = Vec::new();
    for run in 0..3 {
        let step = job.next_step().unwrap().expect("a step");
        let points = entry(&cache, step.data().id(), step.data().values());
        let centres = entry(&cache, step.id(), step.centres());
        // Points: the first run's entry, uploaded once (it would be full).
        if run > 0 {
            assert!(Arc::ptr_eq(&points, &seen[0]), "points uploaded again");
        }
        // Centres change every run: a fresh entry each time.
        assert!(
            seen.iter().all(|e| !Arc::ptr_eq(e, &centres)),
            "run {run} found stale centres"
        );
        assert!(centres.lock().unwrap().is_none());
        seen.push(points);
        seen.push(centres);
        // Every item computed (on the CPU; the run cache is what is tested).
        let mut step = step;
        let items = step.items();
        crate::with_chunk(&mut step, 0..items, |k, c| k.run_cpu(c)).unwrap();
        job.absorb(step).unwrap();
    }
}

#[test]
fn nbody_uploads_each_steps_positions_afresh_even_at_a_reused_address() {
    let mut job = NbodyJob::new(NbodyProblem::new(64, 4).unwrap()).unwrap();
    let cache = RunCache::default();
    let mut seen: Vec<(run_cache::Entry, usize, Vec<f32>)> = Vec::new();
    while let Some(mut step) = job.next_step().unwrap() {
        let (id, x) = (step.id(), &step.old().x);
        let e = entry(&cache, id, x);
        assert!(
            seen.iter().all(|s| !Arc::ptr_eq(&s.0, &e)),
            "stale positions"
        );
        // Asked again within the run (another chunk, the other stream): found.
        assert!(Arc::ptr_eq(&e, &entry(&cache, id, x)));
        seen.push((e, x.as_ptr() as usize, x.clone()));
        crate::with_chunk(&mut step, 0..64, |k, c| k.run_cpu(c)).unwrap();
        job.absorb(step).unwrap();
    }
    assert_eq!(seen.len(), 4);
    // The job swaps two sets of vectors: step 3's positions sit where step
    // 1's did, with other values. Keyed by place and content sampling, the
    // cache could not be sure; keyed by the step's id, it is.
    assert_eq!(seen[0].1, seen[2].1, "the allocation is reused");
    assert_ne!(seen[0].2, seen[2].2);
}

#[test]
fn grid_covers_every_item() {
    let c = grid_1d(1000, 256);
    assert_eq!(c.grid_dim.0, 4);
    assert_eq!(grid_1d(0, 256).grid_dim.0, 1);
}

#[test]
fn run_cache_keeps_what_is_used_and_drops_the_least_recent() {
    let bytes = [0u8; 8];
    let key = |id| RunKey::new(id, &bytes);
    let cache = RunCache::default();
    let first: Vec<_> = (0..RunCache::CAPACITY as u64)
        .map(|tag| cache.entry(key(tag)))
        .collect();
    // Used again (as a model's weights are by every batch): now the most
    // recent, so the next new entry pushes out tag 1, not tag 0.
    assert!(Arc::ptr_eq(&cache.entry(key(0)), &first[0]));
    cache.entry(key(100));
    assert!(Arc::ptr_eq(&cache.entry(key(0)), &first[0]));
    assert!(Arc::ptr_eq(&cache.entry(key(2)), &first[2]));
    assert!(
        !Arc::ptr_eq(&cache.entry(key(1)), &first[1]),
        "tag 1 was dropped"
    );
}

/// Runs `f` on its own thread and gives its result, or fails the test
/// after `limit` (a hang is a failure, not a stuck test run).
fn within<T: Send + 'static>(limit: Duration, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(limit)
        .unwrap_or_else(|_| panic!("did not return within {limit:?}"))
}

/// A signal as a watched wait enqueues it, for the calling thread.
fn signal() -> Arc<Signal> {
    Arc::new(Signal {
        done: AtomicBool::new(false),
        thread: std::thread::current(),
    })
}

#[test]
fn a_watched_wait_wakes_when_the_host_function_runs_not_at_its_next_poll() {
    let took = within(Duration::from_secs(20), || {
        let s = signal();
        let raw = Arc::into_raw(s.clone());
        let addr = raw as usize;
        // The host function, from a thread of its own, while the stream
        // still counts as busy (CUDA ends its work only when it returns).
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            wake(addr as *mut std::ffi::c_void);
        });
        let t0 = Instant::now();
        let flag = AtomicBool::new(false);
        let r = wait_watched(&s, || Ok(false), &flag, t0, Duration::from_secs(3600));
        t.join().unwrap();
        assert_eq!(Arc::strong_count(&s), 1, "wake took its reference back");
        r.map(|()| t0.elapsed())
    });
    let took = took.expect("the work completed");
    assert!(took < Duration::from_secs(10), "woke after {took:?}");
}

#[test]
fn a_watched_wait_ends_in_taken_back_when_the_flag_is_set() {
    let r = within(Duration::from_secs(20), || {
        let flag = Arc::new(AtomicBool::new(false));
        let f = flag.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            f.store(true, Ordering::Release);
        });
        // The work never finishes (a hung kernel): only the flag ends it.
        let r = wait_watched(
            &signal(),
            || Ok(false),
            &flag,
            Instant::now(),
            Duration::from_millis(1),
        );
        t.join().unwrap();
        r
    });
    match r {
        Err(KernelError::TakenBack { secs }) => assert!(secs >= 0.03, "after {secs} s"),
        other => panic!("expected TakenBack, got {other:?}"),
    }
}

#[test]
fn a_watched_wait_prefers_done_work_and_reports_device_errors() {
    let set = AtomicBool::new(true);
    // Done and flagged at once: the result is kept, not thrown away.
    let now = Instant::now();
    assert!(wait_watched(&signal(), || Ok(true), &set, now, TAKE_BACK_POLL).is_ok());
    let s = signal();
    s.done.store(true, Ordering::Release);
    assert!(wait_watched(&s, || Ok(false), &set, now, TAKE_BACK_POLL).is_ok());
    let e = wait_watched(
        &signal(),
        || Err(KernelError::Cuda("launch failed".into())),
        &set,
        now,
        TAKE_BACK_POLL,
    );
    assert!(matches!(e, Err(KernelError::Cuda(_))), "{e:?}");
}
