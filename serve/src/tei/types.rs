//! Text Embeddings Inference's wire API as types: each route's request and
//! answer, named and shaped as TEI's own (`router/src/http/types.rs`).
//! Unknown fields are ignored, as TEI's serde defaults do. Every input
//! list is bounded while it is read ([`crate::bounded`]); the checks of
//! values (an empty text, an option coexec does not serve) are the
//! handlers'.

use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use utoipa::ToSchema;

use crate::bounded::{Batch, bounded_seq};
use crate::error::{ErrorResponse, ErrorType};

/// A request body of one of TEI's routes.
pub(crate) trait Request: de::DeserializeOwned {
    /// What the body should hold, for its 422s.
    const SHAPE: &'static str;
}

/// One input or a batch of them: `"text"`, `[101, 7592]` (token ids),
/// or a batch `["text", [101, 7592], ...]` (TEI's untagged `Input`).
/// Written by hand, not derived untagged: serde's untagged enums buffer
/// the whole value before they choose, where the batch must be bounded as
/// it is read. An array's first element tells which it is: a number, one
/// input of ids; a string or an array, a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Input<T = InputType> {
    Single(T),
    Batch(Vec<T>),
}

/// One input of `/embed` and `/v1/embeddings`: a text, or token ids the
/// client tokenised itself (TEI's `InputType`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum InputType {
    Text(String),
    Ids(Vec<u32>),
}

impl From<String> for InputType {
    fn from(s: String) -> Self {
        InputType::Text(s)
    }
}

/// An input that may be token ids: `InputType` may, `/tokenize`'s text
/// may not (`None`: refused as not a string).
pub(crate) trait FromIds: Sized {
    fn from_ids(ids: Vec<u32>) -> Option<Self>;
}

impl FromIds for InputType {
    fn from_ids(ids: Vec<u32>) -> Option<Self> {
        Some(InputType::Ids(ids))
    }
}

impl FromIds for String {
    fn from_ids(_: Vec<u32>) -> Option<Self> {
        None
    }
}

/// A token id: a whole number from 0 to `u32::MAX`.
fn id_of<E: de::Error>(v: u64, exp: &dyn de::Expected) -> Result<u32, E> {
    u32::try_from(v).map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), exp))
}

/// A list of token ids, each a whole number from 0 to `u32::MAX`.
fn ids_of<'de, A: SeqAccess<'de>>(mut seq: A, mut ids: Vec<u32>) -> Result<Vec<u32>, A::Error> {
    while let Some(id) = seq.next_element::<u32>()? {
        ids.push(id);
    }
    Ok(ids)
}

impl<'de> Deserialize<'de> for InputType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct TextOrIds;
        impl<'de> Visitor<'de> for TextOrIds {
            type Value = InputType;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of token ids")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<InputType, E> {
                Ok(InputType::Text(s.to_owned()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<InputType, E> {
                Ok(InputType::Text(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<InputType, A::Error> {
                ids_of(seq, Vec::new()).map(InputType::Ids)
            }
        }
        d.deserialize_any(TextOrIds)
    }
}

/// `/tokenize`'s inputs: texts only (TEI's `TokenizeInput`).
pub(crate) type TokenizeInput = Input<String>;

impl<'de, T: Deserialize<'de> + From<String> + FromIds> Deserialize<'de> for Input<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// An array's first element: an id (the array is one input of
        /// ids) or an item (the array is a batch).
        enum First<T> {
            Id(u32),
            Item(T),
        }
        impl<'de, T: From<String> + FromIds> Deserialize<'de> for First<T> {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct IdOrItem<T>(PhantomData<T>);
                impl<'de, T: From<String> + FromIds> Visitor<'de> for IdOrItem<T> {
                    type Value = First<T>;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a string")
                    }
                    fn visit_u64<E: de::Error>(self, v: u64) -> Result<First<T>, E> {
                        id_of(v, &self).map(First::Id)
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<First<T>, E> {
                        Ok(First::Item(s.to_owned().into()))
                    }
                    fn visit_string<E: de::Error>(self, s: String) -> Result<First<T>, E> {
                        Ok(First::Item(s.into()))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<First<T>, A::Error> {
                        let ids = ids_of(seq, Vec::new())?;
                        T::from_ids(ids)
                            .map(First::Item)
                            .ok_or_else(|| de::Error::invalid_type(de::Unexpected::Seq, &self))
                    }
                }
                d.deserialize_any(IdOrItem(PhantomData))
            }
        }
        struct OneOrBatch<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + From<String> + FromIds> Visitor<'de> for OneOrBatch<T> {
            type Value = Input<T>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string or an array of strings")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Input<T>, E> {
                Ok(Input::Single(s.to_owned().into()))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Input<T>, E> {
                Ok(Input::Single(s.into()))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Input<T>, A::Error> {
                match seq.next_element::<First<T>>()? {
                    None => Ok(Input::Batch(Vec::new())),
                    Some(First::Id(id)) => {
                        let ids = ids_of(seq, vec![id])?;
                        T::from_ids(ids)
                            .map(Input::Single)
                            .ok_or_else(|| de::Error::invalid_type(de::Unexpected::Seq, &self))
                    }
                    Some(First::Item(t)) => bounded_seq(seq, vec![t]).map(Input::Batch),
                }
            }
        }
        d.deserialize_any(OneOrBatch(PhantomData))
    }
}

impl<T> Input<T> {
    /// The inputs in order, none missing and none empty, or the 400
    /// `Empty` (`field` names them in it).
    pub(crate) fn into_items(
        self,
        field: &str,
        is_empty: impl Fn(&T) -> bool,
    ) -> Result<Vec<T>, ErrorResponse> {
        let items = match self {
            Input::Single(t) => vec![t],
            Input::Batch(items) if items.is_empty() => {
                return Err(empty(format!("`{field}` cannot be empty")));
            }
            Input::Batch(items) => items,
        };
        match items.iter().position(is_empty) {
            Some(k) => Err(empty(format!("`{field}[{k}]` is an empty string"))),
            None => Ok(items),
        }
    }
}

impl Input<InputType> {
    /// The inputs, texts or ids, none empty, or the 400 `Empty`.
    pub(crate) fn into_inputs(self, field: &str) -> Result<Vec<InputType>, ErrorResponse> {
        let items = self.into_items(field, |i| matches!(i, InputType::Text(t) if t.is_empty()))?;
        match items
            .iter()
            .position(|i| matches!(i, InputType::Ids(ids) if ids.is_empty()))
        {
            Some(k) => Err(empty(format!("`{field}[{k}]` holds no token ids"))),
            None => Ok(items),
        }
    }
}

impl TokenizeInput {
    /// The texts, none empty, or the 400 `Empty`.
    pub(crate) fn into_texts(self, field: &str) -> Result<Vec<String>, ErrorResponse> {
        self.into_items(field, String::is_empty)
    }
}

/// A 400 `Empty`.
pub(crate) fn empty(msg: String) -> ErrorResponse {
    ErrorResponse::new(ErrorType::Empty, msg)
}

/// Which end of an input too long for the model is cut: `right` keeps
/// its first tokens, `left` its last (a text's special tokens kept).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
pub(crate) enum TruncationDirection {
    #[serde(rename = "left", alias = "Left")]
    Left,
    #[default]
    #[serde(rename = "right", alias = "Right")]
    Right,
}

impl From<TruncationDirection> for coexec_models::TruncationDirection {
    fn from(d: TruncationDirection) -> Self {
        match d {
            TruncationDirection::Left => Self::Left,
            TruncationDirection::Right => Self::Right,
        }
    }
}

/// `POST /embed`'s body.
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct EmbedRequest {
    pub(crate) inputs: Input,
    /// Cut a text past the model's limit; absent or null: yes (`/info`'s
    /// `auto_truncate`); false: 422 for such a text.
    pub(crate) truncate: Option<bool>,
    #[serde(default)]
    pub(crate) truncation_direction: TruncationDirection,
    /// A prompt of the model's sentence-transformers configuration to put
    /// before each text; a name the model lacks: 422.
    pub(crate) prompt_name: Option<String>,
    /// Unit vectors; absent or null: yes.
    pub(crate) normalize: Option<bool>,
    /// The vectors' first `dimensions` values (Matryoshka), normalised
    /// after the cut; absent: all of them.
    pub(crate) dimensions: Option<usize>,
}

impl Request for EmbedRequest {
    const SHAPE: &'static str = r#"{"inputs": string or [string, ...], "truncate": bool, "normalize": bool, "dimensions": n}"#;
}

/// `POST /embed_sparse`'s body (TEI's `EmbedSparseRequest`).
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct EmbedSparseRequest {
    pub(crate) inputs: Input,
    pub(crate) truncate: Option<bool>,
    #[serde(default)]
    pub(crate) truncation_direction: TruncationDirection,
    pub(crate) prompt_name: Option<String>,
}

impl Request for EmbedSparseRequest {
    const SHAPE: &'static str =
        r#"{"inputs": string or [string, ...], "truncate": bool, "prompt_name": string}"#;
}

/// `POST /embed_all`'s body (TEI's `EmbedAllRequest`): `/embed`'s, less
/// what pooled vectors take (`normalize`, `dimensions`).
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct EmbedAllRequest {
    pub(crate) inputs: Input,
    /// Cut an input past the model's limit; absent or null: yes.
    pub(crate) truncate: Option<bool>,
    #[serde(default)]
    pub(crate) truncation_direction: TruncationDirection,
    /// A prompt of the model's to put before each input (its tokens
    /// among the answer's); a name the model lacks: 422.
    pub(crate) prompt_name: Option<String>,
}

impl Request for EmbedAllRequest {
    const SHAPE: &'static str = r#"{"inputs": string or [string, ...], "truncate": bool, "truncation_direction": "right" or "left", "prompt_name": string}"#;
}

/// `/embed_all`'s answer: for each input, every token's vector after the
/// model's last layer (special tokens included; not pooled, not
/// normalised).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EmbedAllResponse(pub(crate) Vec<Vec<Vec<f32>>>);

/// One non-zero value of a sparse vector: its index in the vocabulary.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SparseValue {
    pub(crate) index: usize,
    pub(crate) value: f32,
}

/// `/embed_sparse`'s answer: each input's non-zero values, by index.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EmbedSparseResponse(pub(crate) Vec<Vec<SparseValue>>);

/// `/embed`'s answer: a vector per input, in order.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EmbedResponse(pub(crate) Vec<Vec<f32>>);

/// `POST /v1/embeddings`' body (OpenAI's embeddings API).
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct OpenAiRequest {
    pub(crate) input: Input,
    /// Ignored: the service serves one model, which its answer names.
    #[allow(dead_code)]
    pub(crate) model: Option<String>,
    /// Ignored.
    #[allow(dead_code)]
    pub(crate) user: Option<String>,
    /// Absent or null: `float`.
    pub(crate) encoding_format: Option<EncodingFormat>,
    pub(crate) dimensions: Option<usize>,
    /// coexec's, beside OpenAI's fields: the model's prompt by name, as on
    /// `/embed` (TEI reads none here and applies the default prompt; so
    /// does coexec when it is absent).
    pub(crate) prompt_name: Option<String>,
}

impl Request for OpenAiRequest {
    const SHAPE: &'static str = r#"{"input": string or [string, ...], "model": string, "encoding_format": "float", "dimensions": n}"#;
}

/// How `/v1/embeddings` writes a vector: numbers, or base64 of its
/// little-endian `f32` bytes (OpenAI's and TEI's).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub(crate) enum EncodingFormat {
    #[default]
    Float,
    Base64,
}

/// `/v1/embeddings`' answer.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OpenAiResponse {
    pub(crate) object: &'static str,
    pub(crate) data: Vec<OpenAiEmbedding>,
    pub(crate) model: String,
    pub(crate) usage: OpenAiUsage,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OpenAiEmbedding {
    pub(crate) object: &'static str,
    pub(crate) embedding: Embedding,
    pub(crate) index: usize,
}

/// A vector as `/v1/embeddings` writes it (TEI's untagged `Embedding`).
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum Embedding {
    Float(Vec<f32>),
    Base64(String),
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct OpenAiUsage {
    pub(crate) prompt_tokens: usize,
    pub(crate) total_tokens: usize,
}

/// `POST /similarity`'s body.
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct SimilarityRequest {
    pub(crate) inputs: SimilarityInput,
    pub(crate) parameters: Option<SimilarityParameters>,
}

impl Request for SimilarityRequest {
    const SHAPE: &'static str = r#"{"inputs": {"source_sentence": string, "sentences": [string, ...]}, "parameters": {"truncate": bool}}"#;
}

#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct SimilarityInput {
    /// The sentence the others are compared with; it counts in the batch.
    pub(crate) source_sentence: String,
    #[schema(value_type = Vec<String>)]
    pub(crate) sentences: Batch<String>,
}

#[derive(Debug, Default, Deserialize, ToSchema)]
pub(crate) struct SimilarityParameters {
    pub(crate) truncate: Option<bool>,
    #[serde(default)]
    pub(crate) truncation_direction: TruncationDirection,
    pub(crate) prompt_name: Option<String>,
}

/// `/similarity`'s answer: the cosine of each sentence with the source.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct SimilarityResponse(pub(crate) Vec<f32>);

/// `POST /tokenize`'s body.
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct TokenizeRequest {
    pub(crate) inputs: TokenizeInput,
    /// `[CLS]` and `[SEP]` among the tokens; absent or null: yes.
    pub(crate) add_special_tokens: Option<bool>,
    pub(crate) prompt_name: Option<String>,
}

impl Request for TokenizeRequest {
    const SHAPE: &'static str =
        r#"{"inputs": string or [string, ...], "add_special_tokens": bool}"#;
}

/// `/tokenize`'s answer: each text's tokens.
pub(crate) type TokenizeResponse = Vec<Vec<coexec_models::Token>>;

/// `/decode`'s ids: one list, or a batch of lists (TEI's `InputIds`).
/// Written by hand for the batch's bound: its first element tells which.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum InputIds {
    Single(Vec<u32>),
    Batch(Vec<Vec<u32>>),
}

impl<'de> Deserialize<'de> for InputIds {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// The first element of `ids`: an id, or a list of them.
        enum First {
            Id(u32),
            Ids(Vec<u32>),
        }
        impl<'de> Deserialize<'de> for First {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct IdOrIds;
                impl<'de> Visitor<'de> for IdOrIds {
                    type Value = First;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a token id or an array of token ids")
                    }
                    fn visit_u64<E: de::Error>(self, v: u64) -> Result<First, E> {
                        u32::try_from(v)
                            .map(First::Id)
                            .map_err(|_| E::invalid_value(de::Unexpected::Unsigned(v), &self))
                    }
                    fn visit_i64<E: de::Error>(self, v: i64) -> Result<First, E> {
                        u32::try_from(v)
                            .map(First::Id)
                            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First, A::Error> {
                        let mut ids = Vec::new();
                        while let Some(id) = seq.next_element()? {
                            ids.push(id);
                        }
                        Ok(First::Ids(ids))
                    }
                }
                d.deserialize_any(IdOrIds)
            }
        }
        struct Ids;
        impl<'de> Visitor<'de> for Ids {
            type Value = InputIds;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an array of token ids or an array of arrays of them")
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<InputIds, A::Error> {
                match seq.next_element::<First>()? {
                    None => Ok(InputIds::Single(Vec::new())),
                    Some(First::Id(id)) => {
                        let mut ids = vec![id];
                        while let Some(id) = seq.next_element()? {
                            ids.push(id);
                        }
                        Ok(InputIds::Single(ids))
                    }
                    Some(First::Ids(ids)) => bounded_seq(seq, vec![ids]).map(InputIds::Batch),
                }
            }
        }
        d.deserialize_seq(Ids)
    }
}

impl InputIds {
    /// The lists in order, none empty, or the 400 `Empty`.
    pub(crate) fn into_lists(self) -> Result<Vec<Vec<u32>>, ErrorResponse> {
        match self {
            InputIds::Single(ids) if ids.is_empty() => Err(empty("`ids` cannot be empty".into())),
            InputIds::Single(ids) => Ok(vec![ids]),
            InputIds::Batch(lists) => match lists.iter().position(Vec::is_empty) {
                Some(k) => Err(empty(format!("`ids[{k}]` cannot be empty"))),
                None => Ok(lists),
            },
        }
    }
}

/// `POST /decode`'s body.
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct DecodeRequest {
    pub(crate) ids: InputIds,
    /// Leave `[CLS]` and `[SEP]` out; absent or null: yes.
    pub(crate) skip_special_tokens: Option<bool>,
}

impl Request for DecodeRequest {
    const SHAPE: &'static str =
        r#"{"ids": [id, ...] or [[id, ...], ...], "skip_special_tokens": bool}"#;
}

/// `/decode`'s answer: each list's text.
pub(crate) type DecodeResponse = Vec<String>;

/// `POST /rerank`'s body: a query and the texts to rank by it (TEI's
/// `RerankRequest`).
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct RerankRequest {
    pub(crate) query: String,
    #[schema(value_type = Vec<String>)]
    pub(crate) texts: Batch<String>,
    pub(crate) truncate: Option<bool>,
    #[serde(default)]
    pub(crate) truncation_direction: TruncationDirection,
    #[serde(default)]
    pub(crate) raw_scores: bool,
    #[serde(default)]
    pub(crate) return_text: bool,
}

impl Request for RerankRequest {
    const SHAPE: &'static str = r#"{"query": string, "texts": [string, ...], "truncate": bool, "raw_scores": bool, "return_text": bool}"#;
}

/// One text's rank: its index in the request, its score, and the text
/// where `return_text`.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Rank {
    pub(crate) index: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) text: Option<String>,
    pub(crate) score: f32,
}

/// One input of `/predict`: a text, or a pair `[text, text]` (TEI's
/// `Sequence`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Sequence {
    Single(String),
    Pair(String, String),
}

impl Sequence {
    fn of(mut v: Vec<String>) -> Result<Self, String> {
        match v.len() {
            1 => Ok(Sequence::Single(v.remove(0))),
            2 => {
                let b = v.remove(1);
                Ok(Sequence::Pair(v.remove(0), b))
            }
            n => Err(format!("an input holds 1 or 2 texts, not {n}")),
        }
    }
}

impl<'de> Deserialize<'de> for Sequence {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Sequence::of(Vec::<String>::deserialize(d)?).map_err(de::Error::custom)
    }
}

/// `/predict`'s inputs: `"text"`, `["text"]`, `["text", "text"]` (a pair),
/// or a batch of those in arrays, `[["a"], ["b", "c"]]` (TEI's
/// `PredictInput`); the batch bounded as it is read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PredictInput {
    Single(Sequence),
    Batch(Vec<Sequence>),
}

impl<'de> Deserialize<'de> for PredictInput {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        /// The first element of an array input: a text (the array is one
        /// input) or an array (a batch).
        enum First {
            Text(String),
            Sequence(Sequence),
        }
        impl<'de> Deserialize<'de> for First {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                struct TextOrSeq;
                impl<'de> Visitor<'de> for TextOrSeq {
                    type Value = First;
                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a string or an array of 1 or 2 strings")
                    }
                    fn visit_str<E: de::Error>(self, s: &str) -> Result<First, E> {
                        Ok(First::Text(s.to_owned()))
                    }
                    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<First, A::Error> {
                        let mut v = Vec::new();
                        while let Some(t) = seq.next_element::<String>()? {
                            if v.len() == 2 {
                                return Err(de::Error::custom("an input holds 1 or 2 texts"));
                            }
                            v.push(t);
                        }
                        Sequence::of(v)
                            .map(First::Sequence)
                            .map_err(de::Error::custom)
                    }
                }
                d.deserialize_any(TextOrSeq)
            }
        }
        struct Inputs;
        impl<'de> Visitor<'de> for Inputs {
            type Value = PredictInput;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, a pair [string, string] or a batch [[string], [string, string], ...]")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<PredictInput, E> {
                Ok(PredictInput::Single(Sequence::Single(s.to_owned())))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<PredictInput, A::Error> {
                match seq.next_element::<First>()? {
                    None => Ok(PredictInput::Batch(Vec::new())),
                    Some(First::Text(a)) => match seq.next_element::<String>()? {
                        None => Ok(PredictInput::Single(Sequence::Single(a))),
                        Some(b) => {
                            if seq.next_element::<de::IgnoredAny>()?.is_some() {
                                return Err(de::Error::custom("an input holds 1 or 2 texts"));
                            }
                            Ok(PredictInput::Single(Sequence::Pair(a, b)))
                        }
                    },
                    Some(First::Sequence(s)) => bounded_seq(seq, vec![s]).map(PredictInput::Batch),
                }
            }
        }
        d.deserialize_any(Inputs)
    }
}

/// `POST /predict`'s body (TEI's `PredictRequest`).
#[derive(Debug, Deserialize, ToSchema)]
pub(crate) struct PredictRequest {
    pub(crate) inputs: PredictInput,
    pub(crate) truncate: Option<bool>,
    #[serde(default)]
    pub(crate) truncation_direction: TruncationDirection,
    #[serde(default)]
    pub(crate) raw_scores: bool,
}

impl Request for PredictRequest {
    const SHAPE: &'static str = r#"{"inputs": string, [string, string] or [[string], [string, string], ...], "truncate": bool, "raw_scores": bool}"#;
}

/// A label's score.
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Prediction {
    pub(crate) score: f32,
    pub(crate) label: String,
}

/// `/predict`'s answer: the labels by score, highest first, for the input
/// or for each input of a batch.
#[derive(Debug, Serialize, ToSchema)]
#[serde(untagged)]
pub(crate) enum PredictResponse {
    Single(Vec<Prediction>),
    Batch(Vec<Vec<Prediction>>),
}

/// `GET /info`'s answer: the model and the service's limits (TEI's
/// `Info`, and fields of coexec's own).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct Info {
    pub(crate) model_id: String,
    /// The weights' SHA-256 (TEI: the Hub revision).
    pub(crate) model_sha: String,
    pub(crate) model_dtype: &'static str,
    /// The name `/v1/embeddings` answers with (default: `model_id`).
    pub(crate) served_model_name: String,
    pub(crate) model_type: ModelType,
    /// The encoder's family (`config.json`'s `model_type`; not a TEI
    /// field).
    pub(crate) model_family: &'static str,
    /// The dtype of the weights file; the CPU computes in `model_dtype`
    /// (not a TEI field).
    pub(crate) model_weights_dtype: &'static str,
    /// Width of an embedding, after any Dense module (not a TEI field).
    pub(crate) model_dim: usize,
    /// The names `prompt_name` takes (not a TEI field).
    pub(crate) model_prompts: Vec<String>,
    /// Whether a GPU stream runs the encoder (else the CPU workers alone;
    /// not a TEI field).
    pub(crate) gpu_twin: bool,
    pub(crate) max_concurrent_requests: usize,
    pub(crate) max_input_length: usize,
    /// The stream's token limit per batch, if it has one.
    pub(crate) max_batch_tokens: Option<usize>,
    pub(crate) max_batch_requests: usize,
    pub(crate) max_client_batch_size: usize,
    pub(crate) auto_truncate: bool,
    /// The threads that tokenise: the request handlers' (tokio's
    /// workers; a large request goes to its blocking pool).
    pub(crate) tokenization_workers: usize,
    pub(crate) version: &'static str,
    /// The commit the service was built from, where the build said
    /// (`COEXEC_GIT_SHA`), as TEI's `VERGEN_GIT_SHA`.
    pub(crate) sha: Option<&'static str>,
    /// The image's label, where the build said (`DOCKER_LABEL`, as TEI's).
    pub(crate) docker_label: Option<&'static str>,
    /// Which router answers: `coexec` (not a TEI field).
    pub(crate) router: &'static str,
}

/// What the model does (TEI's `ModelType`; coexec serves embeddings).
#[derive(Debug, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub(crate) enum ModelType {
    Embedding(EmbeddingModel),
    /// A sequence classifier of more than one label.
    Classifier(ClassifierModel),
    /// A sequence classifier of one label: a cross-encoder.
    Reranker(ClassifierModel),
}

/// A classifier's labels both ways (TEI's `ClassifierModel`).
#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct ClassifierModel {
    pub(crate) id2label: std::collections::BTreeMap<String, String>,
    pub(crate) label2id: std::collections::BTreeMap<String, usize>,
}

#[derive(Debug, Serialize, ToSchema)]
pub(crate) struct EmbeddingModel {
    /// `mean`, `cls`, `max`, `mean_sqrt_len` or `last_token`.
    pub(crate) pooling: &'static str,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bounded::{Limits, Overflow, Refused, parse};

    fn read<T: Request>(body: &str, most: usize) -> Result<T, Refused> {
        parse(body.as_bytes(), Limits::new(most, usize::MAX))
    }

    #[test]
    fn an_input_is_a_string_or_an_array_of_them() {
        let r: EmbedRequest = read(r#"{"inputs": "a"}"#, 4).unwrap();
        assert_eq!(r.inputs, Input::Single(InputType::Text("a".into())));
        let r: EmbedRequest = read(r#"{"inputs": ["a", "b\"c"]}"#, 4).unwrap();
        assert_eq!(
            r.inputs.into_inputs("inputs").unwrap(),
            [InputType::Text("a".into()), InputType::Text("b\"c".into())]
        );
        for bad in [
            r#"{"inputs": [-1, 2]}"#,
            r#"{"inputs": [4294967296]}"#,
            r#"{"inputs": ["a", 2]}"#,
            r#"{"inputs": [[1], "a", [1.5]]}"#,
            r#"{"inputs": {"a": 1}}"#,
            r#"{"input": "x"}"#,
        ] {
            let e = read::<EmbedRequest>(bad, 4).unwrap_err();
            assert!(
                matches!(e, Refused::Json(ref e) if e.is_data()),
                "{bad}: {e:?}"
            );
        }
    }

    /// TEI's token-id inputs: one list of ids, or a batch of lists (and
    /// texts); `/tokenize`'s inputs stay texts.
    #[test]
    fn an_input_may_be_token_ids() {
        let r: EmbedRequest = read(r#"{"inputs": [101, 7592, 102]}"#, 2).unwrap();
        assert_eq!(
            r.inputs,
            Input::Single(InputType::Ids(vec![101, 7592, 102]))
        );
        let r: EmbedRequest = read(r#"{"inputs": [[101, 102], "a", []]}"#, 4).unwrap();
        assert_eq!(
            r.inputs,
            Input::Batch(vec![
                InputType::Ids(vec![101, 102]),
                InputType::Text("a".into()),
                InputType::Ids(vec![]),
            ])
        );
        let e = r.inputs.into_inputs("inputs").unwrap_err();
        assert_eq!(e.error, "`inputs[2]` holds no token ids");
        let e = read::<EmbedRequest>(r#"{"inputs": [[1], [2], [3]]}"#, 2).unwrap_err();
        assert!(
            matches!(e, Refused::Overflow(Overflow::TooMany { .. })),
            "{e:?}"
        );
        for bad in [r#"{"inputs": [1, 2]}"#, r#"{"inputs": [[1]]}"#] {
            let e = read::<TokenizeRequest>(bad, 4).unwrap_err();
            assert!(
                matches!(e, Refused::Json(ref e) if e.is_data()),
                "{bad}: {e:?}"
            );
        }
    }

    /// As TEI's: fields it does not know are ignored, not refused.
    #[test]
    fn unknown_fields_are_ignored() {
        let r: EmbedRequest = read(r#"{"inputs": "a", "whatever": [1, {}]}"#, 4).unwrap();
        assert_eq!(r.normalize, None);
        let r: OpenAiRequest = read(r#"{"input": "a", "model": "m", "x": 1}"#, 4).unwrap();
        assert_eq!(r.encoding_format, None);
    }

    #[test]
    fn teis_option_values_are_read() {
        let r: EmbedRequest = read(
            r#"{"inputs": "a", "truncate": null, "truncation_direction": "Left",
                "normalize": false, "dimensions": 64, "prompt_name": "query"}"#,
            4,
        )
        .unwrap();
        assert_eq!(r.truncate, None);
        assert_eq!(r.truncation_direction, TruncationDirection::Left);
        assert_eq!((r.normalize, r.dimensions), (Some(false), Some(64)));
        assert_eq!(r.prompt_name.as_deref(), Some("query"));
        let r: OpenAiRequest = read(r#"{"input": "a", "encoding_format": "base64"}"#, 4).unwrap();
        assert_eq!(r.encoding_format, Some(EncodingFormat::Base64));
    }

    #[test]
    fn empty_inputs_are_teis_empty() {
        let empty = |body: &str| {
            let r: TokenizeRequest = read(body, 4).unwrap();
            r.inputs.into_texts("inputs").unwrap_err()
        };
        assert_eq!(empty(r#"{"inputs": []}"#).error, "`inputs` cannot be empty");
        let e = empty(r#"{"inputs": ["a", ""]}"#);
        assert_eq!(
            (e.error.as_str(), e.error_type),
            ("`inputs[1]` is an empty string", ErrorType::Empty)
        );
    }

    /// A batch past the limit stops at limit + 1 on every route, the
    /// similarity's source sentence counted in it.
    #[test]
    fn every_routes_batch_is_bounded() {
        let too_many = |e: Refused| match e {
            Refused::Overflow(Overflow::TooMany { at_least, most }) => (at_least, most),
            e => panic!("{e:?}"),
        };
        let e = read::<EmbedRequest>(r#"{"inputs": ["a", "b", "c", ] not read"#, 2);
        assert_eq!(too_many(e.unwrap_err()), (3, 2));
        let e = read::<TokenizeRequest>(r#"{"inputs": ["a", "b", "c"]}"#, 2);
        assert_eq!(too_many(e.unwrap_err()), (3, 2));
        let e = read::<DecodeRequest>(r#"{"ids": [[1], [2], [3]]}"#, 2);
        assert_eq!(too_many(e.unwrap_err()), (3, 2));
        let body = r#"{"inputs": {"source_sentence": "a", "sentences": ["b", "c"]}}"#;
        let e = parse::<SimilarityRequest>(body.as_bytes(), Limits::new(2, usize::MAX).after(1));
        assert_eq!(too_many(e.unwrap_err()), (3, 2));
        // One list of ids is one input, however long.
        let r: DecodeRequest = read(r#"{"ids": [1, 2, 3, 4]}"#, 2).unwrap();
        assert_eq!(r.ids, InputIds::Single(vec![1, 2, 3, 4]));
    }

    #[test]
    fn ids_are_one_list_or_a_batch_none_empty() {
        let ids = |body: &str| read::<DecodeRequest>(body, 8).map(|r| r.ids);
        assert_eq!(
            ids(r#"{"ids": [[1, 2], [3]]}"#)
                .unwrap()
                .into_lists()
                .unwrap(),
            [vec![1, 2], vec![3]]
        );
        assert_eq!(
            ids(r#"{"ids": []}"#)
                .unwrap()
                .into_lists()
                .unwrap_err()
                .error,
            "`ids` cannot be empty"
        );
        assert_eq!(
            ids(r#"{"ids": [[7], []]}"#)
                .unwrap()
                .into_lists()
                .unwrap_err()
                .error,
            "`ids[1]` cannot be empty"
        );
        for bad in [
            r#"{"ids": [-1]}"#,
            r#"{"ids": "7"}"#,
            r#"{"ids": [4294967296]}"#,
            r#"{"ids": [1, [2]]}"#,
        ] {
            assert!(
                matches!(ids(bad), Err(Refused::Json(ref e)) if e.is_data()),
                "{bad}"
            );
        }
    }

    #[test]
    fn info_is_teis_shape() {
        let info = Info {
            model_id: "m".into(),
            model_sha: "s".into(),
            model_dtype: "float32",
            served_model_name: "n".into(),
            model_type: ModelType::Embedding(EmbeddingModel { pooling: "mean" }),
            model_family: "bert",
            model_weights_dtype: "float16",
            model_dim: 384,
            model_prompts: vec!["query".into()],
            gpu_twin: true,
            max_concurrent_requests: 512,
            max_input_length: 256,
            max_batch_tokens: None,
            max_batch_requests: 32,
            max_client_batch_size: 32,
            auto_truncate: true,
            tokenization_workers: 0,
            version: "0.1.0",
            sha: None,
            docker_label: None,
            router: "coexec",
        };
        let v = serde_json::to_value(&info).unwrap();
        assert_eq!(
            v["model_type"],
            serde_json::json!({"embedding": {"pooling": "mean"}})
        );
        assert!(v["max_batch_tokens"].is_null());
        assert!(v["sha"].is_null() && v["docker_label"].is_null());
        assert_eq!(v["served_model_name"], "n");
    }
}
