//! One OpenAI error body everywhere: `{"error": {"message", "type", "param", "code"}}`, as the
//! JSON answer of a refused request and as the SSE event of a stream that fails after it began.

use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{json, Value};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
        }
    }

    /// 400 about one request field.
    pub fn field(param: &str, message: impl std::fmt::Display) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            ..ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_request_error",
                format!("'{param}': {message}"),
            )
        }
    }

    /// 400 for a field the server knows but does not implement.
    pub fn unsupported(param: &str) -> ApiError {
        ApiError {
            code: Some("unsupported_parameter"),
            ..ApiError::field(param, "not supported by this server")
        }
    }

    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    pub fn context_length(message: impl Into<String>, param: &str) -> ApiError {
        ApiError {
            param: Some(param.to_string()),
            code: Some("context_length_exceeded"),
            ..ApiError::bad_request(message)
        }
    }

    pub fn unauthorized() -> ApiError {
        ApiError {
            code: Some("invalid_api_key"),
            ..ApiError::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "missing or wrong API key (send 'Authorization: Bearer KEY')",
            )
        }
    }

    pub fn not_found(what: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, "not_found_error", what)
    }

    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method not allowed on this route",
        )
    }

    pub fn overloaded(running: usize, queued: usize) -> ApiError {
        ApiError {
            code: Some("rate_limit_exceeded"),
            ..ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "rate_limit_error",
                format!(
                    "the server is full ({running} requests running, {queued} queued: see --parallel and --queue); retry later"
                ),
            )
        }
    }

    pub fn loading() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "Loading model",
        )
    }

    pub fn shutting_down() -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            "the server is shutting down",
        )
    }

    pub fn too_many_connections(max: usize) -> ApiError {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable_error",
            format!("the server has {max} connections open (--max-connections); retry later"),
        )
    }

    pub fn request_timeout(limit: std::time::Duration) -> ApiError {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s (--io-timeout)",
                limit.as_secs()
            ),
        )
    }

    pub fn payload_too_large(limit: usize) -> ApiError {
        ApiError {
            code: Some("payload_too_large"),
            ..ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "invalid_request_error",
                format!("the body is larger than the limit of {limit} bytes (--max-body)"),
            )
        }
    }

    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    pub fn body(&self) -> Value {
        json!({"error": {
            "message": self.message,
            "type": self.kind,
            "param": self.param,
            "code": self.code,
        }})
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, axum::Json(self.body())).into_response();
        // Loading, draining and full: a router or client may retry, here or elsewhere.
        if self.status == StatusCode::TOO_MANY_REQUESTS
            || self.status == StatusCode::SERVICE_UNAVAILABLE
        {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        r
    }
}
