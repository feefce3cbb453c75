//! Text Embeddings Inference's routes (`/embed`, `/v1/embeddings`,
//! `/tokenize`, `/info`, …) inside your own axum app, beside a route of
//! yours, on every core. Give it a sentence-transformers model folder:
//!
//! `cargo run --release -p coexec-serve --example 10_tei_in_axum -- ~/.cache/coexec/models/all-MiniLM-L6-v2`
//!
//! then `curl -s 127.0.0.1:8080/embed -H 'content-type: application/json' -d '{"inputs":"hi"}'`;
//! Ctrl-C drains it.

use std::sync::Arc;

use coexec::stream::StreamConfig;
use coexec_serve::{ServeConfig, Service};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let usage = "usage: 10_tei_in_axum MODEL_DIR";
    let dir = std::env::args().nth(1).ok_or(usage)?;
    let model = coexec_models::Embedder::load(dir)?;
    let rt = Arc::new(coexec::Runtime::builder().start().await?);
    let svc = Service::start(rt, model, StreamConfig::new(), ServeConfig::new())?;
    let app = axum::Router::new()
        .route("/hello", axum::routing::get(|| async { "mine\n" }))
        .merge(svc.tei_router());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:8080").await?;
    let ctrl_c = async { tokio::signal::ctrl_c().await.unwrap_or(()) };
    coexec_serve::serve(listener, app, ctrl_c).await;
    svc.shutdown().await;
    Ok(())
}
