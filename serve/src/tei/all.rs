//! TEI's `POST /embed_all`: every token's vector of each input, after the
//! model's last layer (special tokens and a prompt's tokens included; not
//! pooled, not normalised).
//!
//! The vectors are the encoder's [`Encoder::token_vectors`], a kernel the
//! stream's batches cannot carry (their outputs are pooled vectors): each
//! request runs as a coexec job of its own on the runtime's CPU workers
//! (the GPU twin pools, so a GPU class never takes it), beside the
//! stream's batches, never on a tokio thread. Its inputs take places of
//! the queue while it runs, as the stream's do, so `/info`'s
//! `max_concurrent_requests` bounds both.
//!
//! An answer is tokens × hidden values, far more than a pooled one: a
//! request past [`ServeConfig::max_embed_all_values`](crate::ServeConfig::max_embed_all_values)
//! is refused (422, before anything runs), and one within it holds
//! [`VALUE_BYTES`] a value of the memory budget until its JSON is written
//! (429 while the budget cannot cover it).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use metrics::histogram;

use super::types::{EmbedAllRequest, EmbedAllResponse};
use super::{
    Api, Cut, Ready, answer_with, not_a, off_the_handler, prompted_inputs, ready, receive_as,
    splade, validation,
};
use crate::Service;
use crate::budget::held_body;
use crate::error::{ErrorResponse, ErrorType};
use crate::infer::{Counted, deadline_passed, draining, failed};
use coexec::stream::Checked;
use coexec_models::Embedder;
use coexec_models::encoder::Encoder;

/// What an answer holds per value at most, for the memory budget: the
/// kernel's output (4 bytes) and its copy as one vector per token (4, and
/// each vector's own header), then that copy and its JSON (an `f32` as
/// `serde_json` writes it, at most 15 characters with its comma:
/// `-1.1754944e-38,`).
pub(super) const VALUE_BYTES: u64 = 24;

/// `POST /embed_all`: every token's vector of each input.
#[utoipa::path(
    post,
    path = "/embed_all",
    tag = "Text Embeddings Inference",
    request_body = EmbedAllRequest,
    responses(
        (status = 200, description = "The answer: for each input, a vector per token", body = EmbedAllResponse),
        (status = 400, description = "No input, an empty one, or a body that is not JSON", body = ErrorResponse),
        (status = 413, description = "A body over the limit", body = ErrorResponse),
        (status = 422, description = "Too many inputs, an input past the limit with truncate: false, an answer past the service's bound, a tokenizer error", body = ErrorResponse),
        (status = 424, description = "The model failed, or gives no token vectors (SPLADE, a classifier or re-ranker)", body = ErrorResponse),
        (status = 429, description = "Overloaded", body = ErrorResponse),
    )
)]
pub(crate) async fn embed_all(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer_with(false, async {
        let (req, admitted) = receive_as::<EmbedAllRequest>(&svc, &headers, body, |l| l).await?;
        let admitted = admitted.counted(req.inputs.method());
        let inputs = req.inputs.into_inputs("inputs")?;
        gives_token_vectors(&svc)?;
        let items = prompted_inputs(svc.model(), req.prompt_name.as_deref(), inputs)?;
        let cut = Cut::new(req.truncate, req.truncation_direction);
        let (ids, ready) = ready(&svc, Api::Tei, admitted, items, cut).await?;
        let (json, times) = token_vectors(&svc, &ready, ids).await?;
        let mut done = ready.done(&svc, &times);
        done.compute_type = "cpu";
        Ok((done, ([(header::CONTENT_TYPE, "application/json")], json)))
    })
    .await
}

/// TEI's 424 for a model without token vectors to give: a classifier or
/// a re-ranker (its output is its head's), a SPLADE model (TEI's "not
/// available for SPLADE models"); and for a service with no CPU workers,
/// where the vectors are computed.
fn gives_token_vectors(svc: &Service<Embedder>) -> Result<(), ErrorResponse> {
    if svc.model().labels().is_some() {
        return Err(not_a("an embedding model"));
    }
    if splade(svc) {
        return Err(failed("`embed_all` is not available for SPLADE models").because("model_type"));
    }
    if !svc.inner.devices.0 {
        return Err(failed(
            "token vectors are computed on the CPU workers, and this service runs on GPUs alone",
        ));
    }
    Ok(())
}

/// Inputs holding places of the queue while their job lives.
struct Places<'a>(&'a AtomicUsize, usize);

impl<'a> Places<'a> {
    /// `n` places, or `None` where the queue has no room for them now.
    fn take(svc: &'a Service<Embedder>, n: usize) -> Option<Self> {
        let i = &svc.inner;
        let (capacity, queued) = (i.stream.capacity(), i.stream.queued());
        i.direct
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |d| {
                (queued + d + n <= capacity).then_some(d + n)
            })
            .ok()?;
        Some(Self(&i.direct, n))
    }
}

impl Drop for Places<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(self.1, Ordering::AcqRel);
    }
}

/// Runs `ids`' token vectors as one job and writes them as TEI's JSON,
/// holding their share of the budget until the server drops the bytes;
/// with each input's wait for the runtime and its run (the job's).
async fn token_vectors(
    svc: &Service<Embedder>,
    ready: &Ready,
    ids: Checked<Vec<u32>>,
) -> Result<(Bytes, Vec<(Duration, Duration)>), ErrorResponse> {
    let i = &svc.inner;
    let n = ids.len();
    let hidden = svc.model().weights().hidden();
    let values = ready.tokens.saturating_mul(hidden);
    let most = i.cfg.max_embed_all_values;
    if values > most {
        return Err(validation(format!(
            "the answer would hold {values} values ({} tokens × the model's width {hidden}), \
             more than the {most} one request may ask for: send fewer or shorter inputs",
            ready.tokens
        )));
    }
    if !ready.accepted {
        return Err(draining());
    }
    let held = svc.take_budget(VALUE_BYTES.saturating_mul(values as u64))?;
    let Some(_places) = Places::take(svc, n) else {
        return Err(svc.overloaded());
    };
    let Some(rt) = i.rt.upgrade() else {
        return Err(ErrorResponse::new(
            ErrorType::Unhealthy,
            "the service has shut down",
        ));
    };
    let _counted = Counted::new(&i.in_flight, n as u64);
    let weights = svc.model().weights().clone();
    let bytes = values.saturating_mul(4);
    // The output's zeroing is the kernel's allocation, off the handler
    // where it is large.
    let kernel = off_the_handler(bytes, move || {
        Encoder::token_vectors(weights, ids.into_inner()).map_err(|e| failed(e.to_string()))
    })
    .await?;
    histogram!("te_batch_next_size").record(n as f64);
    histogram!("te_batch_next_tokens").record(ready.tokens as f64);
    let t0 = Instant::now();
    // Dropping the job's future cancels it: a deadline passed, or a
    // client gone (its handler dropped).
    let run = rt.run(kernel);
    let run = match i.cfg.deadline {
        Some(d) => tokio::time::timeout(d, run)
            .await
            .map_err(|_| deadline_passed())?,
        None => run.await,
    };
    drop(rt);
    let run = run.map_err(|e| {
        tracing::error!("token vectors failed: {e}");
        failed(e.to_string())
    })?;
    let took = t0.elapsed();
    let inference = Duration::try_from_secs_f64(run.report.makespan_s)
        .unwrap_or(took)
        .min(took);
    i.drain
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .answered(n as u64, svc.now());
    let json = off_the_handler(bytes, move || {
        let vectors = run.kernel.into_token_vectors();
        // A value that is not finite is the model's failure (TEI's
        // `Backend`), never a 200 with `null`s.
        for (k, tokens) in vectors.iter().enumerate() {
            if let Some(j) = tokens.iter().position(|v| v.iter().any(|x| !x.is_finite())) {
                return Err(failed(format!(
                    "`{}`: the model's vector of token {j} is not finite: its arithmetic overflowed",
                    Api::Tei.at(k)
                )));
            }
        }
        let json =
            serde_json::to_vec(&EmbedAllResponse(vectors)).map_err(|e| failed(e.to_string()))?;
        Ok(held_body(json, held))
    })
    .await?;
    Ok((json, vec![(took - inference, inference); n]))
}
