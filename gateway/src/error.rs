//! API errors: a status, a stable code and a message that says what to do.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use utoipa::ToSchema;

/// The body of every error response.
#[derive(Debug, Serialize, ToSchema)]
pub struct ErrorBody {
    /// Stable machine-readable code (`not_found`, `not_wasm`, `core_module`, ...).
    pub error: String,
    /// What went wrong and what to do about it.
    pub message: String,
}

/// An error answer.
#[derive(Debug)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Code.
    pub code: &'static str,
    /// Message.
    pub message: String,
}

impl ApiError {
    /// An error with a status, code and message.
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError { status, code, message: message.into() }
    }
    /// 400.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "bad_request", message)
    }
    /// 404 (also for other tenants' objects: their existence is not revealed).
    pub fn not_found(what: &str, id: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("{what} '{id}' not found"))
    }
    /// 409.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(StatusCode::CONFLICT, "conflict", message)
    }
    /// 422.
    pub fn unprocessable(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, code, message)
    }
    /// 500, logged.
    pub fn internal(e: impl std::fmt::Display) -> Self {
        tracing::error!("internal error: {e}");
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", format!("internal error: {e}"))
    }
}

impl From<crate::store::StoreError> for ApiError {
    fn from(e: crate::store::StoreError) -> Self {
        use crate::store::StoreError;
        match e {
            StoreError::Conflict(message) => ApiError::conflict(message),
            StoreError::Overlap(message) => ApiError::new(StatusCode::CONFLICT, "attachment_overlap", message),
            // Two requests creating the same name at once: the loser's
            // answer is the one it would get a moment later.
            StoreError::Sql(rusqlite::Error::SqliteFailure(f, _))
                if f.code == rusqlite::ErrorCode::ConstraintViolation
                    && matches!(
                        f.extended_code,
                        rusqlite::ffi::SQLITE_CONSTRAINT_UNIQUE | rusqlite::ffi::SQLITE_CONSTRAINT_PRIMARYKEY
                    ) =>
            {
                ApiError::conflict("an object of that name was created at the same time; read it and try again")
            }
            e => ApiError::internal(e),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, Json(ErrorBody { error: self.code.to_string(), message: self.message })).into_response()
    }
}

/// axum's `Query`, refused with the JSON error body (not plain text) when
/// the query string does not parse.
#[derive(Debug, Clone)]
pub struct ApiQuery<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned> axum::extract::FromRequestParts<S> for ApiQuery<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Query::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Query(v)| ApiQuery(v))
            .map_err(|e| ApiError::bad_request(format!("query string: {}", e.body_text())))
    }
}

/// axum's `Path`, refused with the JSON error body when a segment does not
/// decode.
#[derive(Debug, Clone)]
pub struct ApiPath<T>(pub T);

impl<S: Send + Sync, T: serde::de::DeserializeOwned + Send> axum::extract::FromRequestParts<S> for ApiPath<T> {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut axum::http::request::Parts, state: &S) -> Result<Self, ApiError> {
        axum::extract::Path::<T>::from_request_parts(parts, state)
            .await
            .map(|axum::extract::Path(v)| ApiPath(v))
            .map_err(|e| ApiError::bad_request(format!("path: {}", e.body_text())))
    }
}

/// A path no route serves: the JSON 404.
pub async fn no_route(uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "no_route",
        format!("nothing is served at {}; the API is under /v1 (see /docs)", uri.path()),
    )
}

/// A route that does not take the request's method: the JSON 405.
pub async fn method_not_allowed(method: axum::http::Method, uri: axum::http::Uri) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        format!("{} does not take {method}; see /docs for its methods", uri.path()),
    )
}
