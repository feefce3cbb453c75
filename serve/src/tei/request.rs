//! Reading TEI's request bodies: the JSON object, its texts and flags,
//! each fault its 4xx with TEI's `error_type`.

use axum::http::StatusCode;
use axum::response::Response;
use serde_json::Value;

use crate::infer::{error, error_of};

/// A 422 `Validation`: JSON of the wrong shape.
pub(super) fn unprocessable(msg: impl Into<String>) -> Response {
    error_of(StatusCode::UNPROCESSABLE_ENTITY, "Validation", msg)
}

/// `obj[name]` as a flag: true where absent or null; a 422 where not a
/// boolean.
pub(super) fn flag(obj: &serde_json::Map<String, Value>, name: &str) -> Result<bool, Response> {
    match obj.get(name) {
        None | Some(Value::Null) => Ok(true),
        Some(Value::Bool(b)) => Ok(*b),
        Some(v) => Err(unprocessable(format!(
            "`{name}` must be true or false, not {v}"
        ))),
    }
}

/// A request body's JSON object (`shape` says what it should hold), or its
/// 4xx.
pub(super) fn object(body: &[u8], shape: &str) -> Result<serde_json::Map<String, Value>, Response> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        let status = if e.is_data() {
            StatusCode::UNPROCESSABLE_ENTITY
        } else {
            StatusCode::BAD_REQUEST
        };
        error(status, format!("the body is not JSON: {e}"))
    })?;
    match v {
        Value::Object(obj) => Ok(obj),
        _ => Err(unprocessable(format!("expected a JSON object {shape}"))),
    }
}

/// `v`, the request's `field`: one text or at most `most` of them, none
/// empty; or the 4xx.
pub(super) fn texts(v: Option<&Value>, field: &str, most: usize) -> Result<Vec<String>, Response> {
    let texts = match v {
        None => return Err(unprocessable(format!("missing field `{field}`"))),
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => {
            if a.len() > most {
                return Err(error_of(
                    StatusCode::PAYLOAD_TOO_LARGE,
                    "Validation",
                    format!("batch size {} > maximum allowed batch size {most}", a.len()),
                ));
            }
            let mut texts = Vec::with_capacity(a.len());
            for (k, t) in a.iter().enumerate() {
                match t {
                    Value::String(s) => texts.push(s.clone()),
                    other => {
                        return Err(unprocessable(format!(
                            "`{field}[{k}]` must be a string, not {}",
                            kind(other)
                        )));
                    }
                }
            }
            texts
        }
        Some(other) => {
            return Err(unprocessable(format!(
                "`{field}` must be a string or an array of strings, not {}",
                kind(other)
            )));
        }
    };
    if texts.is_empty() {
        return Err(error_of(
            StatusCode::BAD_REQUEST,
            "Empty",
            format!("`{field}` cannot be empty"),
        ));
    }
    if let Some(k) = texts.iter().position(String::is_empty) {
        return Err(error_of(
            StatusCode::BAD_REQUEST,
            "Empty",
            format!("`{field}[{k}]` is an empty string"),
        ));
    }
    Ok(texts)
}

/// What `v` is, for an error.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
