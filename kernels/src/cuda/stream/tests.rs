use super::*;

#[test]
fn fingerprint_sees_changes_anywhere_in_small_inputs() {
    let a = vec![1.0f32; 1000];
    let mut b = a.clone();
    b[517] = 1.5;
    assert_ne!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&b)));
    assert_eq!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&a.clone())));
}

#[test]
fn fingerprint_samples_large_inputs_including_the_tail() {
    let a: Vec<u32> = (0..1_000_000).collect();
    let mut b = a.clone();
    *b.last_mut().unwrap() += 1;
    assert_ne!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&b)));
    let c: Vec<u32> = a.iter().map(|x| x + 1).collect();
    assert_ne!(fingerprint(as_bytes(&a)), fingerprint(as_bytes(&c)));
}

#[test]
fn grid_covers_every_item() {
    let c = grid_1d(1000, 256);
    assert_eq!(c.grid_dim.0, 4);
    assert_eq!(grid_1d(0, 256).grid_dim.0, 1);
}

#[test]
fn run_cache_keeps_what_is_used_and_drops_the_least_recent() {
    let key = |tag| RunKey {
        owner: 0,
        tag,
        ptr: 64,
        len: 8,
        print: 0,
    };
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
