//! coexec inside an existing tokio service: many tasks submit small jobs at
//! once, served fairly, while the service's own tasks keep running; a
//! request whose deadline passes cancels its job.
//!
//! `cargo run --release --example 02_in_tokio`

use std::sync::Arc;
use std::time::Duration;

use coexec::kernels::Synthetic;
use coexec::{JobOrder, Runtime};

#[tokio::main]
async fn main() -> Result<(), coexec::Error> {
    let rt = Arc::new(
        Runtime::builder()
            .job_order(JobOrder::Fair)
            .in_memory_profiles()
            .start()
            .await?,
    );
    let started = std::time::Instant::now();
    let mut requests = Vec::new();
    for i in 0..64 {
        let rt = rt.clone();
        requests.push(tokio::spawn(async move {
            let done = rt.run(Synthetic::new(2_000 + 100 * i, 100)).await?;
            Ok::<_, coexec::Error>(done.report.makespan_s)
        }));
    }
    let mut worst: f64 = 0.0;
    for r in requests {
        worst = worst.max(r.await.expect("task")?);
    }
    println!(
        "64 jobs in {:.3}s; slowest job's makespan {worst:.4}s",
        started.elapsed().as_secs_f64()
    );
    // A request with a deadline: when the timeout drops the future, the job
    // is cancelled (no more chunks are handed out) and the workers are free.
    let late = tokio::time::timeout(
        Duration::from_millis(20),
        rt.run(Synthetic::new(5_000_000, 1_000)),
    )
    .await;
    println!(
        "a 5M-item job given 20 ms: {}",
        if late.is_err() { "cancelled" } else { "done" }
    );
    Arc::try_unwrap(rt).expect("sole owner").shutdown().await;
    Ok(())
}
