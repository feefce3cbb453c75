//! TEI's routes for sequence classifiers: `POST /rerank` for a
//! cross-encoder (one label: the query with each text, scored and sorted)
//! and `POST /predict` for a classifier (each input's labels by score).
//! On a model of embeddings both are TEI's 424, as `/embed` is on a
//! classifier.
//!
//! Scores are TEI's: a classifier's logits through a softmax (one label:
//! a sigmoid), or as they are with `raw_scores`.

use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::Response;
use coexec_models::Embedder;

use super::types::{
    PredictInput, PredictRequest, PredictResponse, Prediction, Rank, RerankRequest, Sequence,
};
use super::{Api, Cut, Item, answer, not_a, receive_as, run_inputs};
use crate::Service;
use crate::error::ErrorResponse;

/// The scores of one input's logits: a softmax over several labels, the
/// sigmoid of one, or the logits themselves where `raw`.
fn scores(mut logits: Vec<f32>, raw: bool) -> Vec<f32> {
    if raw {
        return logits;
    }
    if let [x] = logits.as_mut_slice() {
        *x = 1.0 / (1.0 + (-*x).exp());
        return logits;
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in &mut logits {
        *v = (*v - max).exp();
        sum += *v;
    }
    logits.iter_mut().for_each(|v| *v /= sum);
    logits
}

/// A score that is not a number is the model's failure (its 424), never
/// an order of NaNs.
fn finite(score: f32) -> Result<f32, ErrorResponse> {
    if score.is_nan() {
        return Err(super::failed("score is NaN"));
    }
    Ok(score)
}

/// `POST /rerank`: the query paired with each text, by score, highest
/// first.
#[utoipa::path(
    post,
    path = "/rerank",
    tag = "Text Embeddings Inference",
    request_body = RerankRequest,
    responses(
        (status = 200, description = "The answer", body = Vec<Rank>),
        (status = 400, description = "No input, an empty one, or a body that is not JSON", body = ErrorResponse),
        (status = 413, description = "A body over the limit", body = ErrorResponse),
        (status = 422, description = "Too many inputs, an input past the limit with truncate: false, a tokenizer error", body = ErrorResponse),
        (status = 424, description = "The model failed, or is of another kind", body = ErrorResponse),
        (status = 429, description = "Overloaded", body = ErrorResponse),
    )
)]
pub(crate) async fn rerank(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(false, async {
        if svc.model().labels().map(<[String]>::len) != Some(1) {
            return Err(not_a("a re-ranker model"));
        }
        let (req, admitted) = receive_as::<RerankRequest>(&svc, &headers, body, |l| l).await?;
        let admitted = admitted.counted("batch");
        let texts = req.texts.0;
        if texts.is_empty() {
            return Err(super::types::empty("`texts` cannot be empty".into()));
        }
        if req.query.is_empty() {
            return Err(super::types::empty("`query` is an empty string".into()));
        }
        if let Some(k) = texts.iter().position(String::is_empty) {
            return Err(super::types::empty(format!(
                "`texts[{k}]` is an empty string"
            )));
        }
        let pairs = texts
            .iter()
            .map(|t| Item::Seq(Sequence::Pair(req.query.clone(), t.clone())))
            .collect();
        let cut = Cut::new(req.truncate, req.truncation_direction);
        let (logits, done) = run_inputs(&svc, Api::Rerank, admitted, pairs, cut).await?;
        let mut ranks = logits
            .into_iter()
            .zip(texts)
            .enumerate()
            .map(|(index, (l, text))| {
                Ok(Rank {
                    index,
                    text: req.return_text.then_some(text),
                    score: finite(scores(l, req.raw_scores)[0])?,
                })
            })
            .collect::<Result<Vec<_>, ErrorResponse>>()?;
        ranks.sort_by(|a, b| b.score.total_cmp(&a.score));
        Ok((done, ranks))
    })
    .await
}

/// `POST /predict`: each input's labels by score, highest first.
#[utoipa::path(
    post,
    path = "/predict",
    tag = "Text Embeddings Inference",
    request_body = PredictRequest,
    responses(
        (status = 200, description = "The answer", body = PredictResponse),
        (status = 400, description = "No input, an empty one, or a body that is not JSON", body = ErrorResponse),
        (status = 413, description = "A body over the limit", body = ErrorResponse),
        (status = 422, description = "Too many inputs, an input past the limit with truncate: false, a tokenizer error", body = ErrorResponse),
        (status = 424, description = "The model failed, or is of another kind", body = ErrorResponse),
        (status = 429, description = "Overloaded", body = ErrorResponse),
    )
)]
pub(crate) async fn predict(
    State(svc): State<Service<Embedder>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    answer(false, async {
        let Some(labels) = svc.model().labels().map(<[String]>::to_vec) else {
            return Err(not_a("a classifier model"));
        };
        let (req, admitted) = receive_as::<PredictRequest>(&svc, &headers, body, |l| l).await?;
        let method = match req.inputs {
            PredictInput::Single(_) => "single",
            PredictInput::Batch(_) => "batch",
        };
        let admitted = admitted.counted(method);
        let (inputs, single) = match req.inputs {
            PredictInput::Single(s) => (vec![s], true),
            PredictInput::Batch(b) if b.is_empty() => {
                return Err(super::types::empty("`inputs` cannot be empty".into()));
            }
            PredictInput::Batch(b) => (b, false),
        };
        let empty = |s: &Sequence| match s {
            Sequence::Single(a) => a.is_empty(),
            Sequence::Pair(a, b) => a.is_empty() || b.is_empty(),
        };
        if let Some(k) = inputs.iter().position(empty) {
            return Err(super::types::empty(format!(
                "`inputs[{k}]` holds an empty string"
            )));
        }
        let items = inputs.into_iter().map(Item::Seq).collect();
        let cut = Cut::new(req.truncate, req.truncation_direction);
        let (logits, done) = run_inputs(&svc, Api::Predict, admitted, items, cut).await?;
        let mut out = Vec::with_capacity(logits.len());
        for l in logits {
            let mut p = scores(l, req.raw_scores)
                .into_iter()
                .zip(&labels)
                .map(|(score, label)| {
                    Ok(Prediction {
                        score: finite(score)?,
                        label: label.clone(),
                    })
                })
                .collect::<Result<Vec<_>, ErrorResponse>>()?;
            p.sort_by(|a, b| b.score.total_cmp(&a.score));
            out.push(p);
        }
        let answer = if single {
            PredictResponse::Single(out.pop().unwrap_or_default())
        } else {
            PredictResponse::Batch(out)
        };
        Ok((done, answer))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::scores;

    #[test]
    fn scores_are_teis() {
        let s = scores(vec![0.0], false);
        assert_eq!(s, vec![0.5]);
        let s = scores(vec![1.0, 1.0, 1.0 + 3f32.ln()], false);
        assert!(
            (s[2] - 0.6).abs() < 1e-6 && (s[0] - 0.2).abs() < 1e-6,
            "{s:?}"
        );
        assert_eq!(scores(vec![-2.5, 7.0], true), vec![-2.5, 7.0]);
        // Large logits do not overflow the softmax.
        let s = scores(vec![1000.0, 0.0], false);
        assert!((s[0] - 1.0).abs() < 1e-6 && s[1] < 1e-30);
    }
}
