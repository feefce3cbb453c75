//! coexec leaves the panic hook to the application: each panic of a kernel
//! reaches it. Where the program asks (`print_each_panic_once`), a kernel
//! that panics on every chunk fails its job with one printed panic, not one
//! per chunk and retry (about 120 for one job). Its own test binary: it
//! counts the process's panic-hook calls.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use coexec::kernels::{Chunk, Kernel, KernelError};

/// Chunks the kernel was asked to run (each one panicked).
static RUNS: AtomicUsize = AtomicUsize::new(0);

#[derive(Debug)]
struct AlwaysPanics;

impl Kernel for AlwaysPanics {
    fn name(&self) -> &str {
        "always-panics"
    }
    fn items(&self) -> usize {
        100_000
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        RUNS.fetch_add(1, Ordering::SeqCst);
        panic!("item {} is bad", chunk.range().start);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kernel_panicking_on_every_chunk_prints_one_panic() {
    let hook_calls = Arc::new(AtomicUsize::new(0));
    let calls = hook_calls.clone();
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        calls.fetch_add(1, Ordering::SeqCst);
        default(info);
    }));
    let rt = coexec::Runtime::builder()
        .devices("cpu:2,sim:1@0.5")
        .unwrap()
        .in_memory_profiles()
        .start()
        .await
        .unwrap();
    // The hook untouched: it sees every panic.
    let e = rt.run(AlwaysPanics).await.expect_err("the job fails");
    assert!(e.to_string().contains("is bad"), "{e}");
    let runs = RUNS.swap(0, Ordering::SeqCst);
    assert!(runs > 1, "{runs} chunks panicked");
    assert_eq!(
        hook_calls.swap(0, Ordering::SeqCst),
        runs,
        "every panic reaches the hook"
    );

    KernelError::print_each_panic_once();
    for _ in 0..3 {
        let e = rt.run(AlwaysPanics).await.expect_err("the job fails");
        assert!(e.to_string().contains("is bad"), "{e}");
    }
    rt.shutdown().await;
    let runs = RUNS.load(Ordering::SeqCst);
    assert!(runs > 3, "{runs} chunks panicked");
    assert_eq!(hook_calls.load(Ordering::SeqCst), 1, "panics printed");
    // A panic outside the runtime's calls still reaches the hook.
    let _ = std::panic::catch_unwind(|| panic!("elsewhere"));
    assert_eq!(hook_calls.load(Ordering::SeqCst), 2);
}
