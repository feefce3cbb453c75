//! coexec embedded in a `#[tokio::main]` program: actix runs on its own
//! thread, the application's runtime is untouched, many tasks submit at once.

use std::sync::Arc;
use std::time::Duration;

use coexec::kernels::Synthetic;
use coexec::kernels::workloads::{KmeansConfig, KmeansData, KmeansJob};
use coexec::{JobOptions, JobOrder, Runtime};

#[tokio::main]
async fn app() -> Result<(), coexec::Error> {
    let rt = Arc::new(
        Runtime::builder()
            .devices("cpu:2,sim:1@3")?
            .in_memory_profiles()
            .build()?,
    );
    // The application keeps using its own runtime while jobs run.
    let ticker = tokio::spawn(async {
        let mut n = 0;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(1)).await;
            n += 1;
        }
        n
    });
    let mut tasks = Vec::new();
    for i in 0..32 {
        let rt = rt.clone();
        tasks.push(tokio::spawn(async move {
            rt.run(Synthetic::new(500 + i * 13, 10)).await
        }));
    }
    for t in tasks {
        let mut done = t.await.expect("task")?;
        done.kernel.verify().expect("exactly once");
    }
    assert_eq!(ticker.await.expect("ticker"), 10);
    // An iterative job: the profiler learns between its runs.
    let data = KmeansData::from_values(
        400,
        2,
        (0..800).map(|i| ((i * 7919) % 101) as f32).collect(),
    )?;
    let (out, reports) = rt
        .drive(
            KmeansJob::new(data, KmeansConfig::new(3, 0.001)?)?,
            JobOptions::default(),
        )
        .await?;
    assert_eq!(reports.len(), out.iterations);
    Arc::try_unwrap(rt).expect("sole owner").shutdown().await;
    Ok(())
}

#[test]
fn embeds_in_a_tokio_main_program() {
    app().unwrap();
}

#[tokio::test(flavor = "current_thread")]
async fn works_from_a_current_thread_runtime_and_orders_by_priority() {
    let rt = Runtime::builder()
        .devices("cpu:1")
        .unwrap()
        .in_memory_profiles()
        .job_order(JobOrder::Priority)
        .build()
        .unwrap();
    // The low-priority job is long (~0.25 s on one core), so the small
    // high-priority one is surely admitted while it runs.
    let low = rt.run_with(Synthetic::new(2_000_000, 50), JobOptions::new().priority(0));
    let high = rt.run_with(Synthetic::new(2_000, 50), JobOptions::new().priority(10));
    let (low, high) = tokio::join!(low, high);
    let (low, high) = (low.unwrap(), high.unwrap());
    // Admitted together; the high-priority job ends first.
    assert!(
        high.report.started_s + high.report.makespan_s
            <= low.report.started_s + low.report.makespan_s
    );
    rt.shutdown().await;
}

#[test]
fn dropping_the_runtime_cancels_cleanly() {
    let rt = Runtime::builder()
        .devices("cpu:2")
        .unwrap()
        .in_memory_profiles()
        .build()
        .unwrap();
    let tokio = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    tokio.block_on(async {
        let job = rt.run(Synthetic::new(50_000_000, 100));
        tokio::select! {
            _ = job => panic!("a 50M-item job cannot finish this fast"),
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    });
    let t = std::time::Instant::now();
    rt.shutdown_now();
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// A task that counts 5 ms ticks on the runtime it is spawned on: it ticks
/// only while that runtime's threads are free to run it.
struct Ticker {
    ticks: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl Ticker {
    fn start() -> Self {
        let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let task = tokio::spawn({
            let ticks = ticks.clone();
            async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(5)).await;
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            }
        });
        Self { ticks, task }
    }

    /// Stops it; the ticks it counted.
    fn stop(self) -> usize {
        self.task.abort();
        self.ticks.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// `Builder::start` builds on a blocking thread: while it waits for the
/// profile's lock (held here by another thread for 300 ms, as another
/// process saving would), the one thread of a current-thread runtime keeps
/// running other tasks. `build()` awaited in its place would hold that
/// thread for the whole wait: the ticker would not tick.
#[tokio::test(flavor = "current_thread")]
async fn start_keeps_the_executor_running_while_it_waits() {
    let dir = std::env::temp_dir().join(format!("coexec-test-start-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let builder = || {
        Runtime::builder()
            .devices("cpu:1")
            .unwrap()
            .profile_dir(&dir)
    };
    // A first runtime names the profile (its file name is the machine's).
    let rt = builder().start().await.unwrap();
    let lock_path = rt.profile_path().unwrap().with_extension("lock");
    rt.shutdown().await;

    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .unwrap();
    lock.lock().unwrap();
    let holder = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        lock.unlock().unwrap();
    });
    let ticker = Ticker::start();
    let t0 = std::time::Instant::now();
    let rt = builder().start().await.unwrap();
    let waited = t0.elapsed();
    let n = ticker.stop();
    holder.join().unwrap();
    assert!(
        waited >= Duration::from_millis(250),
        "start waited for the lock: {waited:?}"
    );
    assert!(n >= 10, "{n} ticks while start waited {waited:?}");
    rt.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// A stream model whose `build` is real host work of 40 ms a batch.
struct SlowModel;

impl coexec::stream::Model for SlowModel {
    type Input = u32;
    type Output = u32;
    type Kernel = Synthetic;
    fn build(&self, inputs: Vec<u32>) -> Result<Synthetic, coexec::kernels::KernelError> {
        let t0 = std::time::Instant::now();
        let mut x = 0u64;
        while t0.elapsed() < Duration::from_millis(40) {
            x = std::hint::black_box(x.wrapping_add(1));
        }
        Ok(Synthetic::new(inputs.len(), 10))
    }
    fn outputs(&self, k: Synthetic) -> Result<Vec<u32>, coexec::kernels::KernelError> {
        use coexec::kernels::Kernel;
        Ok(vec![7; k.items()])
    }
}

/// A model's slow `build` runs on the blocking pool: on a current-thread
/// runtime the one thread keeps running other tasks through five batches
/// (200 ms of builds). Inline, the ticker would tick about once a batch.
#[tokio::test(flavor = "current_thread")]
async fn a_slow_model_builds_off_the_executor() {
    use coexec::stream::{Stream, StreamConfig};

    let rt = Arc::new(
        Runtime::builder()
            .devices("cpu:1")
            .unwrap()
            .in_memory_profiles()
            .start()
            .await
            .unwrap(),
    );
    let stream = Stream::start(rt.clone(), SlowModel, StreamConfig::new()).unwrap();
    let ticker = Ticker::start();
    let t0 = std::time::Instant::now();
    for i in 0..5 {
        assert_eq!(stream.infer(i).await.unwrap(), 7);
    }
    let took = t0.elapsed();
    let n = ticker.stop();
    assert!(n >= 10, "{n} ticks in {took:?} of five 40 ms builds");
    stream.shutdown().await;
    drop(stream);
    Arc::try_unwrap(rt).expect("sole owner").shutdown().await;
}
