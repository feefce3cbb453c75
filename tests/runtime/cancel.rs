//! Async etiquette: dropping the future of `run()` cancels the job, and
//! neither `shutdown().await` nor dropping the runtime blocks the caller's
//! executor thread while worker threads finish the chunk in hand.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use coexec::kernels::{Chunk, Kernel, KernelError, Synthetic};
use coexec::{JobOptions, Runtime};

/// What a [`Counted`] kernel did, readable after it is gone.
#[derive(Debug, Default)]
struct Counters {
    /// `run_cpu` calls (chunks handed to a worker).
    calls: AtomicUsize,
    /// Items run.
    items: AtomicUsize,
    /// Set when the kernel is dropped.
    dropped: AtomicBool,
}

/// A kernel that sleeps `per_item` per item and counts what it ran.
#[derive(Debug)]
struct Counted {
    items: usize,
    per_item: Duration,
    seen: Arc<Counters>,
}

impl Counted {
    fn new(items: usize, per_item: Duration) -> (Self, Arc<Counters>) {
        let seen = Arc::new(Counters::default());
        let k = Self {
            items,
            per_item,
            seen: seen.clone(),
        };
        (k, seen)
    }
}

impl Kernel for Counted {
    fn name(&self) -> &str {
        "counted"
    }

    fn items(&self) -> usize {
        self.items
    }

    fn run_cpu(&self, chunk: &Chunk) -> Result<(), KernelError> {
        self.seen.calls.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(self.per_item * chunk.len() as u32);
        self.seen.items.fetch_add(chunk.len(), Ordering::SeqCst);
        Ok(())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.seen.dropped.store(true, Ordering::SeqCst);
    }
}

/// Waits (asynchronously) until `seen`'s kernel is dropped; how long it took.
async fn until_dropped(seen: &Counters, limit: Duration) -> Duration {
    let t = Instant::now();
    while !seen.dropped.load(Ordering::SeqCst) {
        assert!(
            t.elapsed() < limit,
            "the kernel was not dropped within {limit:?} of the cancellation"
        );
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    t.elapsed()
}

fn runtime(devices: &str) -> Runtime {
    Runtime::builder()
        .devices(devices)
        .expect("spec")
        .in_memory_profiles()
        .build()
        .expect("the runtime starts")
}

/// The runtime still works after a cancellation.
async fn another_job_runs(rt: &Runtime) {
    let mut done = rt
        .run(Synthetic::new(10_000, 10))
        .await
        .expect("a job after the cancelled one");
    done.kernel.verify().expect("every item exactly once");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_future_of_run_cancels_the_job() {
    let rt = runtime("cpu:2,sim:1@0.5");
    // 100 000 items of 100 µs: seconds of work on these workers, in chunks
    // of 5 ms (the simulated unit charges core time, and this kernel
    // sleeps: its chunks take about as long there).
    let items = 100_000;
    let (k, seen) = Counted::new(items, Duration::from_micros(100));
    let fut = rt.run_with(k, JobOptions::new().chunk(50));
    let r = tokio::time::timeout(Duration::from_millis(50), fut).await;
    assert!(r.is_err(), "the job cannot be over after 50 ms");
    // The future is gone: the job's chunks stop being handed out, and the
    // kernel goes as soon as the chunks in flight are over.
    until_dropped(&seen, Duration::from_secs(2)).await;
    let (calls, ran) = (
        seen.calls.load(Ordering::SeqCst),
        seen.items.load(Ordering::SeqCst),
    );
    assert!(
        ran < items / 10,
        "{ran} of {items} items ran after a cancel at 50 ms ({calls} chunks)"
    );
    assert_eq!(ran, calls * 50, "every chunk handed out ran to its end");
    // What the workers count agrees (a worker counts its chunk just after
    // letting go of the kernel), and nothing more runs for this job.
    let t = Instant::now();
    while rt.progress().iter().map(|(_, n)| n).sum::<u64>() != ran as u64 {
        // A bound on the wait, not a speed: the counts must come to agree.
        assert!(t.elapsed() < Duration::from_secs(10), "{:?}", rt.progress());
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(seen.calls.load(Ordering::SeqCst), calls);
    another_job_runs(&rt).await;
    rt.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn aborting_the_task_that_awaits_run_cancels_the_job() {
    let rt = Arc::new(runtime("cpu:2"));
    let items = 100_000;
    let (k, seen) = Counted::new(items, Duration::from_micros(100));
    let task = {
        let rt = rt.clone();
        tokio::spawn(async move { rt.run_with(k, JobOptions::new().chunk(50)).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    until_dropped(&seen, Duration::from_secs(2)).await;
    let ran = seen.items.load(Ordering::SeqCst);
    assert!(ran < items / 10, "{ran} of {items} items ran");
    another_job_runs(&rt).await;
    Arc::into_inner(rt).expect("ours alone").shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_dropped_right_after_submission_is_cancelled() {
    let rt = runtime("cpu:1");
    let (k, seen) = Counted::new(1_000, Duration::from_micros(100));
    {
        // Polled once: submitted, then dropped, most likely before the
        // broker admitted it (it then never runs).
        let fut = rt.run(k);
        tokio::pin!(fut);
        assert!(futures_poll_once(fut.as_mut()).await.is_none());
    }
    until_dropped(&seen, Duration::from_secs(2)).await;
    // Whatever the broker had already admitted stops at once; at most the
    // chunks in flight at the cancel ran.
    assert!(seen.items.load(Ordering::SeqCst) < 1_000);
    another_job_runs(&rt).await;
    rt.shutdown().await;
}

/// Polls `f` once; `Some` if it was ready.
async fn futures_poll_once<F: std::future::Future + Unpin>(mut f: F) -> Option<F::Output> {
    std::future::poll_fn(|cx| {
        std::task::Poll::Ready(match std::pin::Pin::new(&mut f).poll(cx) {
            std::task::Poll::Ready(v) => Some(v),
            std::task::Poll::Pending => None,
        })
    })
    .await
}

/// Starts a job of four chunks of `chunk` each on one CPU worker and drops
/// its future as soon as the first chunk is in hand.
async fn one_chunk_in_flight(rt: &Runtime, chunk: Duration) -> Arc<Counters> {
    let (k, seen) = Counted::new(4, chunk);
    let fut = rt.run_with(k, JobOptions::new().chunk(1));
    tokio::pin!(fut);
    let t = Instant::now();
    while seen.calls.load(Ordering::SeqCst) == 0 {
        assert!(t.elapsed() < Duration::from_secs(10), "no chunk started");
        tokio::select! {
            r = &mut fut => panic!("the job cannot be over yet: {r:?}"),
            _ = tokio::time::sleep(Duration::from_millis(1)) => {}
        }
    }
    seen
}

/// Ticks every 5 ms on the caller's executor; the count so far.
fn ticker() -> Arc<AtomicUsize> {
    let ticks = Arc::new(AtomicUsize::new(0));
    let t = ticks.clone();
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(Duration::from_millis(5)).await;
            t.fetch_add(1, Ordering::SeqCst);
        }
    });
    ticks
}

#[tokio::test(flavor = "current_thread")]
async fn shutdown_does_not_block_a_current_thread_runtime() {
    let rt = runtime("cpu:1");
    // The worker has just started a 400 ms chunk: shutdown has to wait for it.
    let seen = one_chunk_in_flight(&rt, Duration::from_millis(400)).await;
    let ticks = ticker();
    tokio::task::yield_now().await;
    let (t, before) = (Instant::now(), ticks.load(Ordering::SeqCst));
    rt.shutdown().await;
    let (took, ticked) = (t.elapsed(), ticks.load(Ordering::SeqCst) - before);
    assert!(
        seen.items.load(Ordering::SeqCst) >= 1,
        "shutdown returned before the chunk in hand ended ({took:?})"
    );
    // Blocking the only executor thread would have stopped the ticker.
    assert!(
        ticked >= 10,
        "the ticker ticked {ticked} times during a {took:?} shutdown"
    );
    assert!(
        seen.dropped.load(Ordering::SeqCst),
        "shutdown ended the job"
    );
}

#[tokio::test(flavor = "current_thread")]
async fn dropping_the_runtime_in_async_code_does_not_wait_for_its_threads() {
    let rt = runtime("cpu:1");
    let seen = one_chunk_in_flight(&rt, Duration::from_millis(400)).await;
    drop(rt);
    assert_eq!(
        seen.items.load(Ordering::SeqCst),
        0,
        "the drop waited for the 400 ms chunk in hand"
    );
    // The threads end on their own once the chunk is done.
    until_dropped(&seen, Duration::from_secs(2)).await;
}
