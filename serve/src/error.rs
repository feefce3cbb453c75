//! The one error answer of every route: `{"error": why, "error_type":
//! kind}`, the kind as Text Embeddings Inference names it ([`ErrorType`]),
//! the status its kind maps to unless its cause has one of its own (a body
//! over the limit 413, a stalled one 408, an unknown path 404, a passed
//! deadline 504).

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use crate::body::Json;

/// What kind of error a request met, as TEI's `ErrorType` spells it on
/// the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
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
    /// ([`ErrorResponse::with_status`]). TEI's, except `Backend`: TEI
    /// answers 424, coexec 500 (TEI 1.9's codes are not adopted yet).
    pub(crate) fn status(self) -> StatusCode {
        match self {
            ErrorType::Unhealthy => StatusCode::SERVICE_UNAVAILABLE,
            ErrorType::Backend => StatusCode::INTERNAL_SERVER_ERROR,
            ErrorType::Overloaded => StatusCode::TOO_MANY_REQUESTS,
            ErrorType::Validation | ErrorType::Tokenizer => StatusCode::UNPROCESSABLE_ENTITY,
            ErrorType::Empty => StatusCode::BAD_REQUEST,
        }
    }
}

/// Why a request was refused: its JSON body (`error`, `error_type`) and
/// how it is sent (status, `Retry-After`, `Connection: close`).
#[derive(Debug, Serialize)]
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
        }
    }

    /// 413 `Validation`: more inputs than a request may carry, or a text
    /// past a limit it may not be cut to. TEI ≤ 1.8's status for these;
    /// TEI 1.9 answers 422.
    #[cfg_attr(not(feature = "tei"), allow(dead_code))]
    pub(crate) fn too_large(error: impl Into<String>) -> Self {
        Self::new(ErrorType::Validation, error).with_status(StatusCode::PAYLOAD_TOO_LARGE)
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
        let mut r = (status, Json(self)).into_response();
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
        let r = ErrorResponse::too_large("batch").into_response();
        assert_eq!(r.status(), StatusCode::PAYLOAD_TOO_LARGE);
        for (t, s) in [
            (ErrorType::Unhealthy, 503),
            (ErrorType::Backend, 500),
            (ErrorType::Overloaded, 429),
            (ErrorType::Validation, 422),
            (ErrorType::Tokenizer, 422),
            (ErrorType::Empty, 400),
        ] {
            assert_eq!(t.status().as_u16(), s, "{t:?}");
        }
    }
}
