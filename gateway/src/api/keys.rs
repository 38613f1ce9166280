//! API keys: a tenant's keys as the operator manages them, and the calling
//! tenant's own (add, rotate, revoke). Only their hashes are stored.

use super::now;
use crate::auth::{Admin, Tenant};
use crate::error::{ApiError, ApiPath, ErrorBody};
use crate::secrets::{hash, new_key};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// A new API key (shown once).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyCreated {
    /// The key.
    pub api_key: String,
    /// Its first characters, for telling keys apart.
    pub prefix: String,
}

/// An API key, as listed (the key itself is never shown again).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyOut {
    /// Its first characters: what revoking names.
    pub prefix: String,
    /// Created, ms since the epoch.
    pub created_ms: i64,
    /// Whether this request was made with it.
    pub current: bool,
}

fn key_list(st: &AppState, tenant_id: &str, current: Option<&str>) -> Result<Vec<KeyOut>, ApiError> {
    let current_prefix = current.and_then(|h| st.store.key_prefix(h).ok().flatten());
    Ok(st
        .store
        .keys(tenant_id)?
        .into_iter()
        .map(|(prefix, created_ms)| KeyOut { current: current_prefix.as_deref() == Some(&prefix), prefix, created_ms })
        .collect())
}

fn revoke(st: &AppState, tenant_id: &str, prefix: &str) -> Result<StatusCode, ApiError> {
    match st.store.revoke_key(tenant_id, prefix)? {
        0 => Err(ApiError::not_found("API key", prefix)),
        1 => {
            tracing::info!(tenant = %tenant_id, prefix, "API key revoked");
            Ok(StatusCode::NO_CONTENT)
        }
        _ => Err(ApiError::conflict(format!("several keys start with '{prefix}'; rotate them instead"))),
    }
}

/// List a tenant's API keys (admin).
#[utoipa::path(get, path = "/v1/tenants/{id}/keys", tag = "tenants", security(("bearer" = [])),
    params(("id" = String, Path, description = "Tenant id")),
    responses((status = 200, body = [KeyOut]), (status = 403, body = ErrorBody)))]
pub async fn tenant_keys(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<Vec<KeyOut>>, ApiError> {
    Ok(Json(key_list(&st, &id, None)?))
}

/// Revoke one of a tenant's API keys by its prefix (admin). Requests with
/// it are refused from the next one on.
#[utoipa::path(delete, path = "/v1/tenants/{id}/keys/{prefix}", tag = "tenants", security(("bearer" = [])),
    params(("id" = String, Path, description = "Tenant id"), ("prefix" = String, Path, description = "Key prefix")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_tenant_key(
    State(st): State<AppState>,
    _: Admin,
    ApiPath((id, prefix)): ApiPath<(String, String)>,
) -> Result<StatusCode, ApiError> {
    revoke(&st, &id, &prefix)
}

/// The calling tenant's API keys.
#[utoipa::path(get, path = "/v1/me/keys", tag = "tenants", security(("bearer" = [])),
    responses((status = 200, body = [KeyOut]), (status = 401, body = ErrorBody)))]
pub async fn my_keys(State(st): State<AppState>, tenant: Tenant) -> Result<Json<Vec<KeyOut>>, ApiError> {
    Ok(Json(key_list(&st, &tenant.id, Some(&tenant.key_hash))?))
}

/// Most API keys a tenant may hold at once.
const MAX_KEYS: usize = 20;

/// Add an API key for the calling tenant (e.g. one per client).
#[utoipa::path(post, path = "/v1/me/keys", tag = "tenants", security(("bearer" = [])),
    responses((status = 201, body = KeyCreated), (status = 401, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn add_my_key(
    State(st): State<AppState>,
    tenant: Tenant,
) -> Result<(StatusCode, Json<KeyCreated>), ApiError> {
    if st.store.keys(&tenant.id)?.len() >= MAX_KEYS {
        return Err(ApiError::conflict(format!("a tenant holds at most {MAX_KEYS} keys; revoke one first")));
    }
    let (key, prefix) = new_key()?;
    st.store.add_key(&tenant.id, &hash(&key), &prefix, now())?;
    Ok((StatusCode::CREATED, Json(KeyCreated { api_key: key, prefix })))
}

/// Rotate the key this request is made with: a new key replaces it, and it
/// is refused from the next request on.
#[utoipa::path(post, path = "/v1/me/keys/rotate", tag = "tenants", security(("bearer" = [])),
    responses((status = 201, body = KeyCreated), (status = 401, body = ErrorBody)))]
pub async fn rotate_my_key(
    State(st): State<AppState>,
    tenant: Tenant,
) -> Result<(StatusCode, Json<KeyCreated>), ApiError> {
    let (key, prefix) = new_key()?;
    if !st.store.rotate_key(&tenant.key_hash, &hash(&key), &prefix, now())? {
        return Err(ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", "this key was revoked meanwhile"));
    }
    tracing::info!(tenant = %tenant.id, prefix = %prefix, "API key rotated");
    Ok((StatusCode::CREATED, Json(KeyCreated { api_key: key, prefix })))
}

/// Revoke one of the calling tenant's keys by its prefix.
#[utoipa::path(delete, path = "/v1/me/keys/{prefix}", tag = "tenants", security(("bearer" = [])),
    params(("prefix" = String, Path, description = "Key prefix")),
    responses((status = 204), (status = 401, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn revoke_my_key(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(prefix): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    revoke(&st, &tenant.id, &prefix)
}

/// Add an API key to a tenant (admin).
#[utoipa::path(post, path = "/v1/tenants/{id}/keys", tag = "tenants", security(("bearer" = [])),
    params(("id" = String, Path, description = "Tenant id")),
    responses((status = 201, body = KeyCreated), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn create_key(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<String>,
) -> Result<(StatusCode, Json<KeyCreated>), ApiError> {
    let (key, prefix) = new_key()?;
    if !st.store.add_key(&id, &hash(&key), &prefix, now())? {
        return Err(ApiError::not_found("tenant", &id));
    }
    Ok((StatusCode::CREATED, Json(KeyCreated { api_key: key, prefix })))
}
