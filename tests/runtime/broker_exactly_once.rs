//! Every item exactly once on real threads: random device mixes, policies,
//! concurrent jobs and injected chunk failures (errors and panics).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use coexec::kernels::{Chunk, Kernel, KernelError, Synthetic};
use coexec::{JobOptions, Runtime};
use proptest::prelude::*;

/// Synthetic, but the first attempt at every `every`-th chunk start fails:
/// alternately with an error and a panic.
struct Flaky {
    inner: Synthetic,
    every: usize,
    failures: AtomicUsize,
    tried: std::sync::Mutex<std::collections::HashSet<usize>>,
}

impl Kernel for Flaky {
    fn name(&self) -> &str {
        "flaky"
    }
    fn items(&self) -> usize {
        self.inner.items()
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        if chunk.lo().is_multiple_of(self.every) && self.tried.lock().unwrap().insert(chunk.lo()) {
            let n = self.failures.fetch_add(1, Ordering::Relaxed);
            if n.is_multiple_of(2) {
                return Err(KernelError::Failed(format!("chunk at {}", chunk.lo())));
            }
            panic!("injected panic at {}", chunk.lo());
        }
        self.inner.run_cpu(chunk)
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 10, ..ProptestConfig::default() })]
    #[test]
    fn exactly_once_with_real_workers(
        cpus in 1usize..3,
        sim in proptest::option::of((1usize..3, 0.2f64..20.0, 0u64..200)),
        policy in 0usize..8,
        jobs in 1usize..4,
        items in 0usize..20_000,
        every in proptest::option::of(3usize..40),
    ) {
        let mut spec = format!("cpu:{cpus}");
        if let Some((n, x, lat)) = sim {
            spec += &format!(",sim:{n}@{x}+{lat}us");
        }
        let p = coexec::policy::names().nth(policy).unwrap();
        // accel-only needs an accelerator class.
        prop_assume!(p != "accel-only" || sim.is_some());
        let rt = Arc::new(Runtime::builder().devices(&spec).unwrap().in_memory_profiles().build().unwrap());
        let tokio = tokio::runtime::Builder::new_multi_thread().worker_threads(2).build().unwrap();
        let results = tokio.block_on(async {
            let mut handles = Vec::new();
            for j in 0..jobs {
                let rt = rt.clone();
                let n = items + j * 7;
                handles.push(tokio::spawn(async move {
                    let opts = JobOptions::new().policy(coexec::policy::by_name(p).unwrap());
                    let k = Flaky {
                        inner: Synthetic::new(n, 20),
                        every: every.unwrap_or(usize::MAX),
                        failures: AtomicUsize::new(0),
                        tried: Default::default(),
                    };
                    rt.run_with(k, opts).await.map(|d| (n, d))
                }));
            }
            let mut out = Vec::new();
            for h in handles {
                out.push(h.await.unwrap());
            }
            out
        });
        for r in results {
            let (n, mut done) = r.unwrap();
            prop_assert_eq!(done.kernel.inner.verify(), Ok(()));
            prop_assert_eq!(done.report.classes.iter().map(|c| c.items).sum::<usize>(), n);
            if every.is_some() && n > 0 {
                prop_assert!(done.report.retries >= 1);
            }
        }
        Arc::try_unwrap(rt).unwrap().shutdown_now();
    }
}

/// A coexec runtime on `devices` with profiles in memory, and a tokio runtime
/// to drive it from a test.
fn runtimes(devices: &str) -> (Runtime, tokio::runtime::Runtime) {
    let rt = Runtime::builder()
        .devices(devices)
        .unwrap()
        .in_memory_profiles()
        .build()
        .unwrap();
    let tokio = tokio::runtime::Builder::new_current_thread()
        .build()
        .unwrap();
    (rt, tokio)
}

#[test]
fn a_chunk_that_always_fails_fails_the_job_without_hanging() {
    #[derive(Debug)]
    struct Broken;
    impl Kernel for Broken {
        fn name(&self) -> &str {
            "broken"
        }
        fn items(&self) -> usize {
            100
        }
        fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
            if chunk.range().contains(&42) {
                panic!("item 42 is cursed");
            }
            Ok(())
        }
    }
    let (rt, tokio) = runtimes("cpu:2");
    let err = tokio.block_on(rt.run(Broken)).unwrap_err().to_string();
    assert!(
        err.contains("failed 4 times") && err.contains("item 42 is cursed"),
        "{err}"
    );
    // The runtime still works afterwards.
    let mut done = tokio.block_on(rt.run(Synthetic::new(1000, 1))).unwrap();
    done.kernel.verify().unwrap();
}

#[test]
fn a_device_that_keeps_failing_is_taken_out_and_the_job_finishes_on_the_rest() {
    // Every chunk on the accelerator fails with a device error (as a CUDA
    // stream whose device is lost would); the CPU computes them.
    struct LostDevice(Synthetic);
    impl Kernel for LostDevice {
        fn name(&self) -> &str {
            "lost_device"
        }
        fn items(&self) -> usize {
            self.0.items()
        }
        fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
            self.0.run_cpu(chunk)
        }
        fn run_modeled(&self, _chunk: &Chunk) -> Option<Result<std::time::Duration, KernelError>> {
            Some(Err(KernelError::Cuda("device lost".into())))
        }
    }
    let (rt, tokio) = runtimes("cpu:1,sim:2@4");
    // Each job gives the accelerator's workers more failures (a worker's
    // strikes count across jobs until it succeeds); within a few jobs both
    // are out, and every job is still complete, with nothing from them.
    let mut out_of_service = false;
    for _ in 0..50 {
        let mut done = tokio
            .block_on(rt.run(LostDevice(Synthetic::new(20_000, 1))))
            .unwrap();
        done.kernel.0.verify().unwrap();
        let sim = &done.report.classes[1];
        assert_eq!(sim.items, 0, "{}", done.report.summary());
        if sim.workers == 0 {
            out_of_service = true;
            break;
        }
    }
    assert!(out_of_service, "the failing workers stayed in service");
    // The next job runs on the CPU alone.
    let mut next = tokio.block_on(rt.run(Synthetic::new(5000, 1))).unwrap();
    next.kernel.verify().unwrap();
    assert_eq!(next.report.classes[1].items, 0);
    assert_eq!(next.report.classes[0].items, 5000);
}
