//! Sentence embeddings on every core: all-MiniLM-L6-v2 behind a batching
//! `Stream`, each sentence its own request, and the cosine similarity of
//! every pair (the sentence-transformers documentation's example).
//!
//! The model folder is fetched and checked by `scripts/fetch_model.sh`:
//!
//! ```text
//! cargo run --release -p coexec-models --example 09_sentence_similarity -- "$(scripts/fetch_model.sh | tail -1)"
//! ```

use std::sync::Arc;

use coexec::stream::{Stream, StreamConfig};
use coexec_models::{Embedder, normalize};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::args()
        .nth(1)
        .ok_or("usage: 09_sentence_similarity MODEL_DIR (scripts/fetch_model.sh makes one)")?;
    let model = Embedder::load(&dir)?;
    let sentences = [
        "A man is eating food.",
        "A man is eating a piece of bread.",
        "The girl is carrying a baby.",
    ];
    // Tokenised here, on the caller's task: the workers see ids only.
    let ids = sentences
        .iter()
        .map(|s| model.tokenize(s, true))
        .collect::<Result<Vec<_>, _>>()?;
    let rt = Arc::new(coexec::Runtime::builder().devices("cpu")?.start().await?);
    let stream = Stream::start(rt.clone(), model, StreamConfig::new())?;
    let pending: Vec<_> = ids.into_iter().map(|i| stream.infer(i)).collect();
    let mut vectors = Vec::new();
    for p in pending {
        let mut v = p.await?;
        normalize(&mut v);
        vectors.push(v);
    }
    println!("cosine similarity ({} dimensions):", vectors[0].len());
    for (i, a) in vectors.iter().enumerate() {
        let row: Vec<String> = vectors
            .iter()
            .map(|b| format!("{:.4}", a.iter().zip(b).map(|(x, y)| x * y).sum::<f32>()))
            .collect();
        println!("  {:<36} {}", sentences[i], row.join("  "));
    }
    stream.shutdown().await;
    Ok(())
}
