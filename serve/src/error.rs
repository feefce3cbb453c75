//! The one error answer of every route: `{"error": why, "error_type":
//! kind}`, the kind as Text Embeddings Inference names it ([`ErrorType`]),
//! the status its kind maps to unless its cause has one of its own (a body
//! over the limit 413, a stalled one 408, an unknown path 404, a passed
//! deadline 504). On OpenAI's route the same error is written as TEI's
//! `OpenAICompatErrorResponse`, `{"message", "code", "type"}`
//! ([`ErrorResponse::openai`]).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::body::Json;

/// What kind of error a request met, as TEI's `ErrorType` spells it on
/// the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[cfg_attr(feature = "tei", derive(utoipa::ToSchema))]
#[cfg_attr(not(feature = "tei"), allow(dead_code))]
pub(crate) enum ErrorType {
    /// The service cannot take requests now (draining, the stream closed).
    Unhealthy,
    /// The model or the runtime failed (a vector not finite, a batch failed).
    Backend,
    /// A full queue or a spent memory budget: retry later.
    Overloaded,
    /// A request the service will not take as it is.
    Validation,
    /// The tokenizer failed on a text.
    Tokenizer,
    /// No input, or an empty one.
    Empty,
}

impl ErrorType {
    /// The status of an error of this type whose cause has none of its own
    /// ([`ErrorResponse::with_status`]): TEI 1.9's (`router/src/http/server.rs`,
    /// `From<&ErrorType> for StatusCode`), `Backend` 424 and every
    /// `Validation` 422, too many inputs included (TEI ≤ 1.8 answered 413).
    pub(crate) fn status(self) -> StatusCode {
        match self {
            ErrorType::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::Backend => StatusCode::FAILED_DEPENDENCY,
            ErrorType::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            ErrorType::Validation | ErrorType::Tokenizer => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorType::Empty => StatusCode::BAD_REQUEST,
        }
    }
}

/// Why a request was refused: its JSON body (`error`, `error_type`) and
/// how it is sent (status, `Retry-After`, `Connection: close`).
#[derive(Debug, Serialize)]
#[cfg_attr(feature = "tei", derive(utoipa::ToSchema))]
pub(crate) struct ErrorResponse {
    pub(crate) error: String,
    pub(crate) error_type: ErrorType,
    #[serde(skip)]
    status: StatusCode,
    /// Seconds, for a 429.
    #[serde(skip)]
    retry_after: Option<u64>,
    /// The connection cannot carry another request (a body left unread,
    /// a drain).
    #[serde(skip)]
    close: bool,
    /// Written in OpenAI's shape (`/v1/embeddings`).
    #[serde(skip)]
    openai: bool,
    /// TEI's `err` label of `te_request_failure`, where the type alone
    /// does not say it ([`ErrorResponse::te_err`]).
    #[serde(skip)]
    cause: Option<&'static str>,
    /// Counted in `te_request_failure`: not for a body that was not read
    /// or not JSON, which TEI's extractors refuse before its handlers
    /// count.
    #[serde(skip)]
    counted: bool,
}

/// TEI's `OpenAICompatErrorResponse`: what `/v1/embeddings` answers for
/// an error (the status in `code`).
#[derive(Serialize)]
#[cfg_attr(feature = "tei", derive(utoipa::ToSchema))]
pub(crate) struct OpenAiError<'a> {
    message: &'a str,
    code: u16,
    #[serde(rename = "type")]
    error_type: ErrorType,
}

impl ErrorResponse {
    /// An error of `error_type`, with the status its type maps to.
    pub(crate) fn new(error_type: ErrorType, error: impl Into<String>) -> Self {
        Self {
            error: error.into(),
            error_type,
            status: error_type.status(),
            retry_after: None,
            close: false,
            openai: false,
            cause: None,
            counted: true,
        }
    }

    /// Written as TEI's `OpenAICompatErrorResponse` (`{"message", "code",
    /// "type"}`), with the same status.
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    pub(crate) fn openai(mut self) -> Self {
        self.openai = true;
        self
    }

    /// With TEI's `err` label for `te_request_failure` (`batch_size`,
    /// `model_type`), where its type's would be another.
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    pub(crate) fn because(mut self, cause: &'static str) -> Self {
        self.cause = Some(cause);
        self
    }

    /// Not counted in `te_request_failure` (a body not read, or not the
    /// JSON of the route's type).
    pub(crate) fn uncounted(mut self) -> Self {
        self.counted = false;
        self
    }

    /// TEI's `err` label of `te_request_failure` for this error: its cause
    /// where it has one, else by type (`validation` for a request refused
    /// as it is, `tokenization`, `overloaded`, `inference`); `None` where
    /// TEI counts none ([`ErrorResponse::uncounted`]).
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    pub(crate) fn te_err(&self) -> Option<&'static str> {
        let by_type = match self.error_type {
            ErrorType::Validation | ErrorType::Empty => "validation",
            ErrorType::Tokenizer => "tokenization",
            ErrorType::Overloaded => "overloaded",
            ErrorType::Backend | ErrorType::Unhealthy => "inference",
        };
        self.counted.then(|| self.cause.unwrap_or(by_type))
    }

    /// The status it is sent with.
    pub(crate) fn status(&self) -> StatusCode {
        self.status
    }

    /// 429 `Overloaded`, with `Retry-After: secs`.
    pub(crate) fn overloaded(error: impl Into<String>, secs: u64) -> Self {
        Self {
            retry_after: Some(secs),
            ..Self::new(ErrorType::Overloaded, error)
        }
    }

    /// With `status` rather than its type's: a cause with a status of its
    /// own (a body that is not JSON 400, one over the limit 413, a stalled
    /// one 408, an unknown path 404, a wrong method 405, a passed deadline
    /// 504).
    pub(crate) fn with_status(mut self, status: StatusCode) -> Self {
        self.status = status;
        self
    }

    /// Sent with `Connection: close`.
    pub(crate) fn closing(mut self) -> Self {
        self.close = true;
        self
    }
}

impl IntoResponse for ErrorResponse {
    fn into_response(self) -> Response {
        let (status, retry_after, close) = (self.status, self.retry_after, self.close);
        let mut r = if self.openai {
            let body = OpenAiError {
                message: &self.error,
                code: status.as_u16(),
                error_type: self.error_type,
            };
            (status, Json(body)).into_response()
        } else {
            (status, Json(self)).into_response()
        };
        let h = r.headers_mut();
        if let Some(secs) = retry_after {
            h.insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        if close {
            h.insert(header::CONNECTION, HeaderValue::from_static("close"));
        }
        r
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_is_teis_json_sent_with_its_types_status() {
        let e = ErrorResponse::new(ErrorType::Empty, "`inputs` cannot be empty");
        assert_eq!(
            serde_json::to_string(&e).unwrap(),
            r#"{"error":"`inputs` cannot be empty","error_type":"Empty"}"#
        );
        assert_eq!(e.into_response().status(), StatusCode::BAD_REQUEST);
        let r = ErrorResponse::overloaded("full", 3)
            .closing()
            .into_response();
        assert_eq!(r.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(r.headers()[header::RETRY_AFTER], "3");
        assert_eq!(r.headers()[header::CONNECTION], "close");
        assert_eq!(r.headers()[header::CONTENT_TYPE], "application/json");
        for (t, s) in [
            (ErrorType::Unhealthy, 503),
            (ErrorType::Backend, 424),
            (ErrorType::Overloaded, 429),
            (ErrorType::Validation, 422),
            (ErrorType::Tokenizer, 422),
            (ErrorType::Empty, 400),
        ] {
            assert_eq!(t.status().as_u16(), s, "{t:?}");
        }
    }

    /// TEI's `OpenAICompatErrorResponse`: the same error, flat, its status
    /// in `code`.
    #[test]
    fn on_openais_route_an_error_is_message_code_type() {
        let r = ErrorResponse::new(ErrorType::Validation, "too many")
            .openai()
            .into_response();
        assert_eq!(r.status(), StatusCode::UNPROCESSABLE_ENTITY);
        let body = futures_body(r);
        assert_eq!(
            body,
            serde_json::json!({"message": "too many", "code": 422, "type": "Validation"})
        );
    }

    fn futures_body(r: Response) -> serde_json::Value {
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let bytes = rt
            .block_on(http_body_util::BodyExt::collect(r.into_body()))
            .unwrap()
            .to_bytes();
        serde_json::from_slice(&bytes).unwrap()
    }
}
