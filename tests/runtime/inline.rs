//! Jobs small enough to run on the submitting thread (`JobOptions::inline`):
//! when they do, when they do not, and that every guarantee of a worker's
//! run holds for them (exactly once, a failed chunk run again, learning).

use std::sync::atomic::{AtomicUsize, Ordering};

use coexec::kernels::{Chunk, DisjointBuf, Empty, Kernel, KernelError, Synthetic};
use coexec::policy::{Admission, PlanContext, Policy};
use coexec::{ErrorKind, JobOptions, Runtime};

fn runtime(devices: &str) -> Runtime {
    Runtime::builder()
        .devices(devices)
        .unwrap()
        .in_memory_profiles()
        .build()
        .unwrap()
}

/// Runs of a tiny kernel until one runs inline; how many it took.
async fn until_inline(rt: &Runtime, opts: &JobOptions) -> Option<usize> {
    for run in 1..=50 {
        let mut done = rt
            .run_with(Synthetic::new(8, 1), opts.clone())
            .await
            .unwrap();
        done.kernel.verify().unwrap();
        if done.report.inline {
            return Some(run);
        }
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tiny_job_runs_inline_once_learned_and_exactly_once() {
    let rt = runtime("cpu:2");
    // The first run has no model: the workers run it, and it is learned.
    let first = rt.run(Synthetic::new(8, 1)).await.unwrap();
    assert!(
        !first.report.inline,
        "an unknown kernel goes to the workers"
    );
    let runs = until_inline(&rt, &JobOptions::new()).await;
    assert!(runs.is_some(), "a job of microseconds never ran inline");
    // Inline from then on, every item once, the report whole.
    for _ in 0..200 {
        let mut done = rt.run(Synthetic::new(8, 1)).await.unwrap();
        done.kernel.verify().unwrap();
        assert_eq!(done.report.items, 8);
        assert_eq!(done.report.classes[0].items, 8);
    }
    // The empty job, once learned, too.
    let mut inline = 0;
    for _ in 0..50 {
        inline += rt.run(Empty::new(1)).await.unwrap().report.inline as usize;
    }
    assert!(inline > 0);
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_does_not_run_inline() {
    let rt = runtime("cpu:2");
    assert!(until_inline(&rt, &JobOptions::new()).await.is_some());
    // Asked not to, or asked for chunks of a size, or traced.
    for opts in [
        JobOptions::new().inline(false),
        JobOptions::new().chunk(1),
        JobOptions::new().trace(true),
    ] {
        let done = rt.run_with(Synthetic::new(8, 1), opts).await.unwrap();
        assert!(!done.report.inline);
    }
    // A job the model predicts long: the workers share it.
    let long = rt.run(Synthetic::new(4000, 2000)).await.unwrap();
    assert!(!long.report.inline);
    assert!(
        long.report.classes[0].chunks > 1,
        "a long job is cut for the workers"
    );
    rt.shutdown().await;

    // Two classes may run it: it is theirs to share, never inline.
    let rt = runtime("cpu:1,sim:1@2");
    for _ in 0..30 {
        let done = rt.run(Synthetic::new(8, 1)).await.unwrap();
        assert!(!done.report.inline);
    }
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_class_takes_the_tiny_job_to_its_workers() {
    let rt = std::sync::Arc::new(runtime("cpu:2"));
    assert!(until_inline(&rt, &JobOptions::new()).await.is_some());
    // A long job keeps the class busy; the tiny ones beside it queue for
    // its workers instead of computing on the submitter's thread.
    let busy = {
        let rt = rt.clone();
        tokio::spawn(async move {
            rt.run_with(Synthetic::new(200_000, 2000), JobOptions::new().chunk(2000))
                .await
        })
    };
    // Once the long job computes (its first items are done), and while it
    // still does.
    let done_items = || rt.progress().iter().map(|(_, n)| n).sum::<u64>();
    let before = done_items();
    while done_items() == before && !busy.is_finished() {
        tokio::time::sleep(std::time::Duration::from_millis(1)).await;
    }
    let mut handed = 0;
    while handed == 0 && !busy.is_finished() {
        let done = rt.run(Synthetic::new(8, 1)).await.unwrap();
        handed += !done.report.inline as usize;
    }
    busy.await.unwrap().unwrap().kernel.verify().unwrap();
    assert!(handed > 0, "no tiny job went to the busy class's workers");
    std::sync::Arc::into_inner(rt).unwrap().shutdown().await;
}

/// Writes each item's index; its first chunk fails.
struct FailsOnce {
    out: DisjointBuf<u64>,
    calls: AtomicUsize,
    writes: Vec<AtomicUsize>,
}

impl Kernel for FailsOnce {
    fn name(&self) -> &str {
        "fails-once"
    }
    fn items(&self) -> usize {
        self.out.items()
    }
    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            return Err(KernelError::Failed("the first chunk fails".into()));
        }
        for (v, i) in self.out.chunk_mut(chunk).iter_mut().zip(chunk.range()) {
            *v = i as u64;
            self.writes[i].fetch_add(1, Ordering::SeqCst);
        }
        Ok(())
    }
}

fn fails_once(n: usize, fail: bool) -> FailsOnce {
    FailsOnce {
        out: DisjointBuf::new(n, 1),
        calls: AtomicUsize::new(if fail { 0 } else { 1 }),
        writes: (0..n).map(|_| AtomicUsize::new(0)).collect(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_inline_chunk_runs_again_and_every_item_is_written_once() {
    let rt = runtime("cpu:2");
    let mut inline = false;
    for _ in 0..50 {
        let done = rt.run(fails_once(16, false)).await.unwrap();
        if done.report.inline {
            inline = true;
            break;
        }
    }
    assert!(inline, "the kernel never ran inline");
    let mut done = rt.run(fails_once(16, true)).await.unwrap();
    assert_eq!(done.report.retries, 1, "the failed chunk ran again");
    let k = &mut done.kernel;
    assert!(k.writes.iter().all(|w| w.load(Ordering::SeqCst) == 1));
    assert_eq!(k.out.as_slice(), (0..16).collect::<Vec<u64>>());
    rt.shutdown().await;
}

/// A policy whose plan panics.
struct Broken;

impl Policy for Broken {
    fn name(&self) -> &'static str {
        "broken"
    }
    fn describe(&self) -> &'static str {
        "panics planning"
    }
    fn admit(&self, _: &PlanContext<'_>) -> Admission {
        panic!("no plan")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_policy_that_panics_fails_its_job_alone() {
    let rt = runtime("cpu:2");
    let opts = JobOptions::new().policy(std::sync::Arc::new(Broken));
    let err = rt
        .run_with(Synthetic::new(100, 10), opts)
        .await
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::Failed, "{err}");
    assert!(err.to_string().contains("broken"), "{err}");
    // The runtime goes on.
    let mut done = rt.run(Synthetic::new(100, 10)).await.unwrap();
    done.kernel.verify().unwrap();
    rt.shutdown().await;
}
