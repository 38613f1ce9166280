//! Tenants (admin): creating and listing them, the host groups each may
//! deploy to, and the calling tenant itself (`/v1/me`).

use super::{PageParams, check_name, created_key, now, page};
use crate::auth::{Admin, Tenant};
use crate::error::{ApiError, ApiPath, ApiQuery, ErrorBody};
use crate::secrets::{hash, new_key, random_hex};
use crate::state::AppState;
use crate::store::TenantRow;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_control::subjects::check_token;
use utoipa::ToSchema;

/// A new tenant.
#[derive(Debug, Deserialize, ToSchema)]
pub struct TenantCreate {
    /// Unique name (letters, digits, '-', '_').
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub name: String,
    /// Host groups it may deploy to (default: the gateway's `default-groups`).
    #[serde(default)]
    #[schema(schema_with = group_names)]
    pub groups: Option<Vec<String>>,
}

/// A tenant.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantOut {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Created, ms since the epoch.
    pub created_ms: i64,
    /// Host groups it may deploy to.
    pub groups: Vec<String>,
}

/// A tenant with its first API key (shown once).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct TenantCreated {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// The API key: send it as `Authorization: Bearer <key>`. Only its hash is stored.
    pub api_key: String,
    /// Host groups it may deploy to.
    pub groups: Vec<String>,
}

/// Create a tenant and its first API key (admin).
#[utoipa::path(post, path = "/v1/tenants", tag = "tenants", request_body = TenantCreate,
    security(("bearer" = [])),
    responses((status = 201, body = TenantCreated), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn create_tenant(
    State(st): State<AppState>,
    _: Admin,
    body: Result<Json<TenantCreate>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<TenantCreated>), ApiError> {
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    check_name("tenant name", &req.name)?;
    let groups = check_groups(req.groups.unwrap_or_else(|| st.config.default_groups.clone()))?;
    let id = format!("t_{}", random_hex(6)?);
    let (key, prefix) = new_key()?;
    let row = TenantRow { id: id.clone(), name: req.name.clone(), created_ms: now() };
    if !st.store.create_tenant(&row, &hash(&key), &prefix)? {
        return Err(ApiError::conflict(format!("a tenant named '{}' exists already", req.name)));
    }
    st.store.set_grants(&id, &groups)?;
    tracing::info!(tenant = %id, name = %req.name, ?groups, "tenant created");
    Ok((StatusCode::CREATED, Json(TenantCreated { id, name: req.name, api_key: key, groups })))
}

/// At most this many groups per grant.
const MAX_GROUPS: usize = 256;

fn check_groups(mut groups: Vec<String>) -> Result<Vec<String>, ApiError> {
    if groups.len() > MAX_GROUPS {
        return Err(ApiError::bad_request(format!("at most {MAX_GROUPS} groups may be granted")));
    }
    for g in &groups {
        check_token("group", g).map_err(|e| ApiError::bad_request(e.to_string()))?;
    }
    groups.sort();
    groups.dedup();
    Ok(groups)
}

/// List tenants (admin), oldest first, paged.
#[utoipa::path(get, path = "/v1/tenants", tag = "tenants", security(("bearer" = [])), params(PageParams),
    responses((status = 200, body = [TenantOut], headers(("Link" = String, description = "the next page, `<path?limit=N&after=CURSOR>; rel=\"next\"`, while more items follow"))),
        (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_tenants(
    State(st): State<AppState>,
    _: Admin,
    ApiQuery(p): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let items = st
        .store
        .tenants()?
        .into_iter()
        .map(|t| {
            let groups = st.store.grants(&t.id)?;
            Ok((
                created_key(t.created_ms, &t.id),
                TenantOut { id: t.id, name: t.name, created_ms: t.created_ms, groups },
            ))
        })
        .collect::<Result<_, ApiError>>()?;
    page("/v1/tenants", items, &p)
}

/// The host groups a tenant may deploy to.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct Grants {
    /// Group names.
    #[schema(schema_with = group_names)]
    pub groups: Vec<String>,
}

/// The schema of a list of group names a tenant is granted.
fn group_names() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema, Type};
    let name = ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"));
    Schema::Array(ArrayBuilder::new().items(name).max_items(Some(MAX_GROUPS)).build())
}

/// Set the host groups a tenant may deploy to (admin). Deployments on a
/// group taken away keep running until the tenant moves or deletes them;
/// new ones and updates are refused there.
#[utoipa::path(put, path = "/v1/tenants/{id}/groups", tag = "tenants", security(("bearer" = [])), request_body = Grants,
    params(("id" = String, Path, description = "Tenant id")),
    responses((status = 200, body = Grants), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn set_grants(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<String>,
    body: Result<Json<Grants>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<Grants>, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let groups = check_groups(req.groups)?;
    if !st.store.set_grants(&id, &groups)? {
        return Err(ApiError::not_found("tenant", &id));
    }
    tracing::info!(tenant = %id, ?groups, "groups granted");
    Ok(Json(Grants { groups }))
}

/// The calling tenant.
#[utoipa::path(get, path = "/v1/me", tag = "tenants", security(("bearer" = [])),
    responses((status = 200, body = TenantOut), (status = 401, body = ErrorBody)))]
pub async fn me(State(st): State<AppState>, tenant: Tenant) -> Result<Json<TenantOut>, ApiError> {
    let groups = st.store.grants(&tenant.id)?;
    Ok(Json(TenantOut { id: tenant.id, name: tenant.name, created_ms: tenant.created_ms, groups }))
}
