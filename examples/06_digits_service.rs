//! The digits service inside your own axum app: coexec's router (`/v1/infer`,
//! `/healthz`, `/readyz`, and `/metrics` from the recorder the app installs)
//! merged beside a route of yours, served on loopback, asked once, then
//! drained and stopped. `08_user_service` does the same for a model of
//! your own.
//!
//! `cargo run --release -p coexec-serve --features workloads --example 06_digits_service`
//!
//! `coexec serve` is the same service as a command (see docs/serving.md).

use std::io::{Read, Write};
use std::sync::Arc;
use std::time::Duration;

use axum::routing::get;
use coexec::kernels::workloads::{LabeledRows, MlpWeights};
use coexec::stream::{MlpModel, Placement, StreamConfig};
use coexec_serve::{ServeConfig, Service};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/models");
    let weights = Arc::new(MlpWeights::load(dir.join("digits_mlp.safetensors"))?);
    let rt = Arc::new(
        coexec::Runtime::builder()
            .devices("cpu:1,sim:1@0.5")?
            .in_memory_profiles()
            .start()
            .await?,
    );
    let stream = StreamConfig::new()
        .max_batch(128)
        .max_wait(Duration::from_micros(500))
        .in_flight(3)
        .placement(Placement::Hybrid);
    // The process's metrics recorder is the app's to install.
    let prometheus = coexec_serve::metrics::install()?;
    let cfg = ServeConfig::new()
        .deadline(Some(Duration::from_millis(500)))
        .prometheus(prometheus);
    let svc = Service::start(rt, MlpModel::new(weights), stream, cfg)?;

    // Your app: your routes, and coexec's.
    let app = axum::Router::new()
        .route(
            "/",
            get(|| async { "my app; inference at POST /v1/infer\n" }),
        )
        .merge(svc.router());

    let listener = coexec_serve::bind("127.0.0.1:0".parse()?).await?;
    let addr = listener.local_addr()?;
    println!("listening on http://{addr}");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(coexec_serve::serve(listener, app, async {
        let _ = stopped.await;
    }));

    // One request, as a client would send it: the first test row.
    let test = LabeledRows::load(dir.join("digits_test.safetensors"))?;
    let body = serde_json::json!({ "inputs": [&test.x[..test.features]] }).to_string();
    let answer = tokio::task::spawn_blocking(move || -> std::io::Result<String> {
        let mut s = std::net::TcpStream::connect(addr)?;
        write!(
            s,
            "POST /v1/infer HTTP/1.1\r\nhost: {addr}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        )?;
        let mut text = String::new();
        s.read_to_string(&mut text)?;
        Ok(text)
    })
    .await??;
    let json = answer.split_once("\r\n\r\n").map_or("", |(_, b)| b);
    println!("POST /v1/infer -> {json}");
    println!("true label: {}", test.labels[0]);

    // Stop accepting, answer what was accepted, stop the stream.
    let _ = stop.send(());
    server.await?;
    svc.shutdown().await;
    Ok(())
}
