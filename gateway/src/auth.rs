//! Who is calling: the operator (admin token) or a tenant (API key, or a
//! dashboard session that reads as one). Keys, tokens and their hashes
//! are made in [`crate::secrets`].

use crate::error::ApiError;
use crate::secrets::hash;
use crate::state::AppState;
use axum::extract::FromRequestParts;
use axum::http::StatusCode;
use axum::http::request::Parts;

fn bearer(parts: &Parts) -> Result<&str, ApiError> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
    let h = parts
        .headers
        .get(axum::http::header::AUTHORIZATION)
        .ok_or_else(|| unauthorized("missing Authorization header; send 'Authorization: Bearer <API key>'"))?;
    let v = h.to_str().map_err(|_| unauthorized("the Authorization header is not text"))?;
    // The scheme is case-insensitive (RFC 9110, section 11.1).
    let (scheme, token) = v.trim_start().split_once(' ').unwrap_or((v, ""));
    Some(token.trim())
        .filter(|t| scheme.eq_ignore_ascii_case("bearer") && !t.is_empty())
        .ok_or_else(|| unauthorized("the Authorization header must be 'Bearer <API key>'"))
}

/// The calling tenant.
#[derive(Debug, Clone)]
pub struct Tenant {
    /// Tenant id.
    pub id: String,
    /// Tenant name.
    pub name: String,
    /// Created, ms since the epoch.
    pub created_ms: i64,
    /// SHA-256 of the key this request came with.
    pub key_hash: String,
}

impl FromRequestParts<AppState> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts)?;
        let key_hash = if token.starts_with(crate::signin::SESSION_PREFIX) {
            // A dashboard session reads as the key that made its link.
            let grant = state.signins.session(token).ok_or_else(|| {
                ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "unauthorized",
                    "this dashboard session has expired; open a new link with `sluice dashboard`",
                )
            })?;
            if !matches!(parts.method, axum::http::Method::GET | axum::http::Method::HEAD) {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    "a dashboard session only reads; use an API key to change anything",
                ));
            }
            grant.key_hash
        } else {
            hash(token)
        };
        // Looked up on every request: a revoked key is refused at once
        // (and with it the dashboard sessions it opened).
        match state.store.tenant_by_key(&key_hash)? {
            Some(t) => Ok(Tenant { id: t.id, name: t.name, created_ms: t.created_ms, key_hash }),
            None => Err(ApiError::new(
                StatusCode::UNAUTHORIZED,
                "unauthorized",
                "unknown API key; ask the operator for a key (`sluice tenant create`)",
            )),
        }
    }
}

/// The operator.
#[derive(Debug, Clone, Copy)]
pub struct Admin;

impl FromRequestParts<AppState> for Admin {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, ApiError> {
        let token = bearer(parts)?;
        // Compare hashes, so the comparison time says nothing about the token.
        if hash(token) == state.admin_hash {
            Ok(Admin)
        } else {
            Err(ApiError::new(StatusCode::FORBIDDEN, "forbidden", "this operation needs the admin token"))
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn parts(v: &str) -> Parts {
        let req = axum::http::Request::builder().header("authorization", v).body(()).unwrap();
        req.into_parts().0
    }

    #[test]
    fn the_bearer_scheme_is_case_insensitive() {
        for v in ["Bearer k1", "bearer k1", "BEARER  k1 ", "bEaReR k1"] {
            assert_eq!(bearer(&parts(v)).unwrap(), "k1", "{v:?}");
        }
        for v in ["Basic k1", "Bearer", "Bearer   ", "k1", "Bearerk1"] {
            assert!(bearer(&parts(v)).is_err(), "{v:?}");
        }
    }
}
