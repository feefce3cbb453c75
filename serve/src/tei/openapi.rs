//! The OpenAPI document of TEI's routes, generated from their types with
//! `utoipa` (TEI's own way), served at `GET /api-doc/openapi.json`.
//!
//! The input types whose deserialisers are written by hand, to bound
//! their batches as they are read, describe their shapes here: each is
//! TEI's untagged `oneOf`.

use std::borrow::Cow;
use std::sync::OnceLock;

use axum::http::header;
use axum::response::{IntoResponse, Response};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ArrayBuilder, OneOfBuilder, Schema};
use utoipa::{OpenApi, PartialSchema, ToSchema};

use super::types::{
    ClassifierModel, DecodeRequest, EmbedAllRequest, EmbedAllResponse, EmbedRequest, EmbedResponse,
    EmbedSparseRequest, EmbedSparseResponse, Embedding, EmbeddingModel, EncodingFormat, Info,
    Input, InputIds, InputType, ModelType, OpenAiEmbedding, OpenAiRequest, OpenAiResponse,
    OpenAiUsage, PredictInput, PredictRequest, PredictResponse, Prediction, Rank, RerankRequest,
    Sequence, SimilarityInput, SimilarityParameters, SimilarityRequest, SimilarityResponse,
    SparseValue, TokenizeInput, TokenizeRequest, TruncationDirection,
};
use crate::error::{ErrorResponse, ErrorType, OpenAiError};

/// One of `items`, as serde's untagged enums read them.
fn one_of(items: impl IntoIterator<Item = RefOr<Schema>>) -> RefOr<Schema> {
    items
        .into_iter()
        .fold(OneOfBuilder::new(), OneOfBuilder::item)
        .into()
}

/// An array of `item`, of `min..=max` items where given.
fn array(item: RefOr<Schema>, min: Option<usize>, max: Option<usize>) -> RefOr<Schema> {
    ArrayBuilder::new()
        .items(item)
        .min_items(min)
        .max_items(max)
        .into()
}

fn ids() -> RefOr<Schema> {
    array(u32::schema(), None, None)
}

impl PartialSchema for InputType {
    fn schema() -> RefOr<Schema> {
        one_of([String::schema(), ids()])
    }
}
impl ToSchema for InputType {}

impl PartialSchema for Input<InputType> {
    fn schema() -> RefOr<Schema> {
        one_of([InputType::schema(), array(InputType::schema(), None, None)])
    }
}
impl ToSchema for Input<InputType> {
    fn name() -> Cow<'static, str> {
        "Input".into()
    }
}

impl PartialSchema for TokenizeInput {
    fn schema() -> RefOr<Schema> {
        one_of([String::schema(), array(String::schema(), None, None)])
    }
}
impl ToSchema for TokenizeInput {
    fn name() -> Cow<'static, str> {
        "TokenizeInput".into()
    }
}

impl PartialSchema for InputIds {
    fn schema() -> RefOr<Schema> {
        one_of([ids(), array(ids(), None, None)])
    }
}
impl ToSchema for InputIds {}

impl PartialSchema for Sequence {
    fn schema() -> RefOr<Schema> {
        one_of([String::schema(), array(String::schema(), Some(1), Some(2))])
    }
}
impl ToSchema for Sequence {}

impl PartialSchema for PredictInput {
    fn schema() -> RefOr<Schema> {
        let pair = array(String::schema(), Some(1), Some(2));
        one_of([String::schema(), pair.clone(), array(pair, None, None)])
    }
}
impl ToSchema for PredictInput {}

/// One token of `/tokenize`'s answer (TEI's `SimpleToken`; the answer is
/// `coexec_models::Token`, of these fields).
#[derive(ToSchema)]
#[allow(dead_code)]
pub(super) struct SimpleToken {
    id: u32,
    text: String,
    special: bool,
    start: Option<usize>,
    stop: Option<usize>,
}

#[derive(OpenApi)]
#[openapi(
    paths(
        super::info,
        super::health,
        super::embed,
        super::all::embed_all,
        super::embed_sparse,
        super::openai,
        super::similarity,
        super::classify::rerank,
        super::classify::predict,
        super::tokens::tokenize,
        super::tokens::decode,
    ),
    components(schemas(
        Info, ModelType, ClassifierModel, EmbeddingModel, EmbedRequest, EmbedResponse,
        EmbedAllRequest, EmbedAllResponse, EmbedSparseRequest,
        EmbedSparseResponse, SparseValue, Input,
        InputType, TruncationDirection, OpenAiRequest, OpenAiResponse, OpenAiEmbedding,
        OpenAiUsage, Embedding, EncodingFormat, SimilarityRequest, SimilarityInput,
        SimilarityParameters, SimilarityResponse, RerankRequest, Rank, PredictRequest,
        PredictInput, Sequence, PredictResponse, Prediction, TokenizeRequest, TokenizeInput,
        SimpleToken, DecodeRequest, InputIds, ErrorResponse, ErrorType, OpenAiError,
    )),
    tags((name = "Text Embeddings Inference", description = "Text Embeddings Inference's API, served by coexec")),
    info(title = "Text Embeddings Inference (coexec)", license(name = "Apache-2.0 OR MIT")),
)]
struct ApiDoc;

/// The document as JSON, built once.
fn document() -> &'static str {
    static DOC: OnceLock<String> = OnceLock::new();
    DOC.get_or_init(|| {
        ApiDoc::openapi()
            .to_json()
            .unwrap_or_else(|e| format!(r#"{{"error": "the OpenAPI document: {e}"}}"#))
    })
}

/// `GET /api-doc/openapi.json`.
pub(crate) async fn openapi_json() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], document()).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every route's path and method, and the inputs' `oneOf`s, are in the
    /// document.
    #[test]
    fn the_document_has_every_route_and_shape() {
        let doc: serde_json::Value = serde_json::from_str(document()).unwrap();
        for (path, method) in [
            ("/info", "get"),
            ("/health", "get"),
            ("/embed", "post"),
            ("/embed_all", "post"),
            ("/embed_sparse", "post"),
            ("/v1/embeddings", "post"),
            ("/similarity", "post"),
            ("/rerank", "post"),
            ("/predict", "post"),
            ("/tokenize", "post"),
            ("/decode", "post"),
        ] {
            assert!(doc["paths"][path][method].is_object(), "{path} {method}");
        }
        let schemas = &doc["components"]["schemas"];
        assert_eq!(schemas["Input"]["oneOf"].as_array().map(Vec::len), Some(2));
        assert!(schemas["EmbedRequest"]["properties"]["inputs"].is_object());
        assert!(schemas["EmbedAllRequest"]["properties"]["truncation_direction"].is_object());
        assert!(schemas["OpenAiError"]["properties"]["type"].is_object());
    }
}
