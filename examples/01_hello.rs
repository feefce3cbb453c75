//! The smallest coexec program: one job on every CPU core plus a simulated
//! accelerator, and its report.
//!
//! `cargo run --release --example 01_hello`

use coexec::kernels::Synthetic;

#[tokio::main]
async fn main() -> Result<(), coexec::Error> {
    let rt = coexec::Runtime::builder()
        .devices("cpu,sim:1@4")?
        .in_memory_profiles()
        .start()
        .await?;
    let mut done = rt.run(Synthetic::new(200_000, 200)).await?;
    done.kernel.verify().expect("every item exactly once");
    println!("{}", done.report.summary());
    rt.shutdown().await;
    Ok(())
}
