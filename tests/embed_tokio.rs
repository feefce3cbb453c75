//! coexec embedded in a `#[tokio::main]` program: actix runs on its own
//! thread, the application's runtime is untouched, many tasks submit at once.

use std::sync::Arc;
use std::time::Duration;

use coexec::kernels::workloads::{KmeansConfig, KmeansData, KmeansJob};
use coexec::kernels::Synthetic;
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
