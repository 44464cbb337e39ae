//! Errors as the two APIs shape them: Ollama's `{"error": "..."}` and OpenAI's
//! `{"error": {"message", "type", "param", "code"}}`.

use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    /// The request field at fault.
    pub param: Option<String>,
    /// Seconds a client should wait before retrying (503 when full).
    pub retry_after: Option<u32>,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            param: None,
            retry_after: None,
        }
    }

    pub fn bad(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }

    /// A 400 naming the field at fault.
    pub fn field(param: &str, why: impl std::fmt::Display) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::bad(format!("{param}: {why}"))
        }
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, message)
    }

    pub fn busy() -> Self {
        ApiError {
            retry_after: Some(1),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server busy: every slot is running and the queue is full; retry shortly",
            )
        }
    }

    fn kind(&self) -> &'static str {
        match self.status.as_u16() {
            400 | 413 | 422 => "invalid_request_error",
            401 => "authentication_error",
            403 => "permission_error",
            404 => "not_found_error",
            503 => "server_overloaded",
            _ => "server_error",
        }
    }

    fn finish(&self, body: serde_json::Value) -> Response {
        let mut r = (self.status, axum::Json(body)).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        self.finish(json!({ "error": self.message }))
    }
}

/// The OpenAI-shaped rendering of an [`ApiError`].
#[derive(Debug)]
pub struct OaiError(pub ApiError);

impl From<ApiError> for OaiError {
    fn from(e: ApiError) -> Self {
        OaiError(e)
    }
}

impl IntoResponse for OaiError {
    fn into_response(self) -> Response {
        let e = &self.0;
        e.finish(json!({ "error": {
            "message": e.message,
            "type": e.kind(),
            "param": e.param,
            "code": e.status.as_u16(),
        }}))
    }
}

impl From<crate::registry::ModelError> for ApiError {
    fn from(e: crate::registry::ModelError) -> Self {
        match e {
            crate::registry::ModelError::NotFound(_) => ApiError::not_found(e.to_string()),
            crate::registry::ModelError::Load { .. } => ApiError::internal(e.to_string()),
        }
    }
}
