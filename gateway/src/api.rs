//! The HTTP API under `/v1`, documented by the OpenAPI document generated
//! from these handlers (`/openapi.json`, Swagger UI at `/docs`).

use crate::auth::{Admin, Tenant, hash, new_key, random_hex};
use crate::billing::{self, BillLine};
use crate::error::{ApiError, ApiPath, ApiQuery, ErrorBody};
use crate::state::{AppState, stored_nfs};
use crate::store::{DeploymentRow, ModuleRow, TenantRow, UsageSums};
use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use serde::{Deserialize, Serialize};
use sluice_control::{HostState, ModuleRef, NfLimitsSpec, NfPlacement, subjects::check_token};
use sluice_runtime::{Chain, FailurePolicy, NfLimits, NfSpec, Routes, RuntimeError};
use sluice_traffic::Attachment;
use std::collections::BTreeMap;
use std::time::Duration;
use utoipa::{IntoParams, ToSchema};

fn now() -> i64 {
    i64::try_from(sluice_control::now_ms()).unwrap_or(i64::MAX)
}

fn check_name(what: &str, s: &str) -> Result<(), ApiError> {
    let ok = !s.is_empty()
        && s.len() <= 64
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "{what} '{s}' is not valid: use 1-64 letters, digits, '-' or '_', starting with a letter or digit"
        )))
    }
}

fn check_version(v: &str) -> Result<(), ApiError> {
    let ok = !v.is_empty() && v.len() <= 64 && v.bytes().all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(format!(
            "version '{v}' is not valid: use 1-64 letters, digits, '.', '_', '+' or '-' (e.g. 1.2.0)"
        )))
    }
}

// ---------------------------------------------------------------- tenants

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

/// A new API key (shown once).
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct KeyCreated {
    /// The key.
    pub api_key: String,
    /// Its first characters, for telling keys apart.
    pub prefix: String,
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

// ---------------------------------------------------------------- paging

/// A page of a list. Lists answer a JSON array in a fixed order; when
/// more items follow, a `Link` header (RFC 8288) names the next page:
/// `Link: </v1/modules?limit=100&after=…>; rel="next"`.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct PageParams {
    /// At most this many items (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u64>,
    /// The cursor from the previous page's `Link` header: the items after
    /// it (an opaque token; it stays valid when that item is deleted).
    #[param(pattern = "^([0-9a-f]{2})*$")]
    pub after: Option<String>,
}

/// The most items one page holds.
pub const MAX_PAGE: u64 = 1000;

/// One page of `items`, given in the list's order, each with a sort key
/// that grows along the list: those whose key is past `after`, at most
/// `limit`, as a JSON array, with the `Link` to the next page if more
/// follow. `path` is the list's own path.
fn page<T: Serialize>(path: &str, items: Vec<(String, T)>, p: &PageParams) -> Result<Response, ApiError> {
    let limit = p.limit.unwrap_or(100);
    if !(1..=MAX_PAGE).contains(&limit) {
        return Err(ApiError::bad_request(format!("limit must be 1-{MAX_PAGE}, not {limit}")));
    }
    let after = match &p.after {
        None => None,
        // A cursor is a sort key: any one is a place in the list.
        Some(c) => Some(hex::decode(c).map(|b| String::from_utf8_lossy(&b).into_owned()).map_err(|_| {
            ApiError::bad_request("after is not a cursor this list gave (take it from its Link header)")
        })?),
    };
    let mut rest = items.into_iter().filter(|(k, _)| after.as_ref().is_none_or(|a| k > a));
    let items: Vec<(String, T)> = rest.by_ref().take(usize::try_from(limit).unwrap_or(100)).collect();
    let next = match (rest.next(), items.last()) {
        (Some(_), Some((k, _))) => Some(hex::encode(k)),
        _ => None,
    };
    let body: Vec<T> = items.into_iter().map(|(_, t)| t).collect();
    let mut resp = Json(body).into_response();
    if let Some(cursor) = next
        && let Ok(v) = header::HeaderValue::from_str(&format!("<{path}?limit={limit}&after={cursor}>; rel=\"next\""))
    {
        resp.headers_mut().insert(header::LINK, v);
    }
    Ok(resp)
}

/// A sort key of lists ordered by creation time, then id.
fn created_key(created_ms: i64, id: &str) -> String {
    format!("{:020}\u{1}{id}", created_ms.max(0))
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
    let name = ObjectBuilder::new().schema_type(Type::String).pattern(Some("^[A-Za-z0-9_-]{1,64}$"));
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

/// The calling tenant.
#[utoipa::path(get, path = "/v1/me", tag = "tenants", security(("bearer" = [])),
    responses((status = 200, body = TenantOut), (status = 401, body = ErrorBody)))]
pub async fn me(State(st): State<AppState>, tenant: Tenant) -> Result<Json<TenantOut>, ApiError> {
    let groups = st.store.grants(&tenant.id)?;
    Ok(Json(TenantOut { id: tenant.id, name: tenant.name, created_ms: tenant.created_ms, groups }))
}

/// A dashboard link.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DashboardLink {
    /// The dashboard's path with a one-time sign-in ticket in its fragment
    /// (`/dashboard#sign-in=...`): put the gateway's URL before it and open
    /// it within `expires_in_s`.
    pub path: String,
    /// Seconds the link signs in within (once).
    pub expires_in_s: u64,
}

/// A link that opens the dashboard signed in as the calling tenant
/// (`sluice dashboard`): it works once, within a minute, and the API key
/// is not in it. The ticket is in the URL's fragment, which browsers do
/// not send to servers.
#[utoipa::path(post, path = "/v1/me/dashboard-link", tag = "tenants", security(("bearer" = [])),
    responses((status = 201, body = DashboardLink), (status = 401, body = ErrorBody), (status = 429, body = ErrorBody)))]
pub async fn dashboard_link(
    State(st): State<AppState>,
    tenant: Tenant,
) -> Result<(StatusCode, Json<DashboardLink>), ApiError> {
    let ticket = st.signins.issue(&tenant.id, &tenant.key_hash)?;
    Ok((
        StatusCode::CREATED,
        Json(DashboardLink {
            path: format!("/dashboard#sign-in={ticket}"),
            expires_in_s: crate::signin::TICKET_TTL.as_secs(),
        }),
    ))
}

/// A dashboard link's ticket.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SessionIn {
    /// The ticket from the link's fragment (`#sign-in=<ticket>`).
    pub ticket: String,
}

/// A dashboard session.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SessionOut {
    /// A bearer token that reads (GET) as the tenant whose key made the
    /// link, until `expires_in_s` pass or that key is revoked.
    pub token: String,
    /// Seconds it lasts.
    pub expires_in_s: u64,
}

/// Trades a dashboard link's ticket, once, for a read-only session.
#[utoipa::path(post, path = "/v1/dashboard/session", tag = "tenants", request_body = SessionIn,
    responses((status = 200, body = SessionOut), (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn dashboard_session(
    State(st): State<AppState>,
    body: Result<Json<SessionIn>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<SessionOut>, ApiError> {
    let Json(s) =
        body.map_err(|e| ApiError::bad_request(format!("expected {{\"ticket\": \"...\"}}: {}", e.body_text())))?;
    if s.ticket.len() > 128 {
        return Err(ApiError::bad_request("ticket is longer than any ticket"));
    }
    let token = st.signins.redeem(&s.ticket)?;
    Ok(Json(SessionOut { token, expires_in_s: crate::signin::SESSION_TTL.as_secs() }))
}

// ---------------------------------------------------------------- hosts

/// A registered host and what the gateway last heard from it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HostOut {
    /// Host id.
    pub host: String,
    /// Group.
    pub group: String,
    /// Its NATS nkey public key, if it has one.
    pub nkey: Option<String>,
    /// `host` (runs deployments) or `dispatcher` (steers the group's
    /// traffic by its ownership table).
    pub role: HostRole,
    /// Heard from within the gateway's `host-silence-ms`.
    pub alive: bool,
    /// Ms since its last heartbeat (none: never heard from).
    pub last_seen_ms_ago: Option<u64>,
    /// Process start, ms since the epoch.
    pub started_ms: Option<u64>,
    /// Software version.
    pub version: Option<String>,
    /// Deployments it runs.
    pub deployments: usize,
    /// The most memory one NF instance may have there (its pool slot),
    /// MiB, as its heartbeats say (none: not heard, or not reported).
    pub memory_slot_mb: Option<u64>,
    /// The most packets per second its meter records may claim.
    pub max_pps: u64,
    /// The most bits per second its meter records may claim.
    pub max_bps: u64,
}

/// List registered hosts with their liveness (admin), by id, paged.
#[utoipa::path(get, path = "/v1/hosts", tag = "hosts", security(("bearer" = [])), params(PageParams),
    responses((status = 200, body = [HostOut], headers(("Link" = String, description = "the next page, `<path?limit=N&after=CURSOR>; rel=\"next\"`, while more items follow"))),
        (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn list_hosts(
    State(st): State<AppState>,
    _: Admin,
    ApiQuery(p): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let seen: BTreeMap<String, crate::state::HostSeen> =
        st.hosts().into_iter().map(|h| (h.heartbeat.host.clone(), h)).collect();
    let items = st
        .store
        .registered_hosts()?
        .into_iter()
        .map(|r| {
            let h = seen.get(&r.id);
            (
                r.id.clone(),
                HostOut {
                    alive: h.is_some_and(|h| h.alive(st.silence())),
                    last_seen_ms_ago: h.map(|h| u64::try_from(h.at.elapsed().as_millis()).unwrap_or(u64::MAX)),
                    started_ms: h.map(|h| h.heartbeat.started_ms),
                    version: h.map(|h| h.heartbeat.version.clone()),
                    deployments: h.map(|h| h.heartbeat.deployments.len()).unwrap_or(0),
                    memory_slot_mb: h.map(|h| h.heartbeat.memory_slot_mb).filter(|&mb| mb > 0),
                    max_pps: r.max_pps.unwrap_or(st.config.meters.host_max_pps),
                    max_bps: r.max_bps.unwrap_or(st.config.meters.host_max_bps),
                    host: r.id,
                    group: r.group,
                    nkey: r.nkey,
                    role: if r.dispatcher { HostRole::Dispatcher } else { HostRole::Host },
                },
            )
        })
        .collect();
    page("/v1/hosts", items, &p)
}

/// A host to register.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct HostIn {
    /// Host id (its `--host-id`).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub id: String,
    /// The group it serves.
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub group: String,
    /// Its NATS nkey public key (`sluice-host keygen` prints it); none for
    /// a bus without authentication.
    #[schema(pattern = "^U[A-Z2-7]{55}$")]
    pub nkey: Option<String>,
    /// `host` (the default) or `dispatcher`.
    #[serde(default)]
    pub role: HostRole,
    /// Packets per second it can process at most (its ports' line rate):
    /// a meter record claiming more over its window is refused. Default:
    /// the gateway's `[meters] host-max-pps`.
    #[schema(minimum = 1, maximum = 10_000_000_000_000_u64)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub max_pps: Option<u64>,
    /// Bits per second it can process at most. Default: `[meters]
    /// host-max-bps`.
    #[schema(minimum = 1, maximum = 10_000_000_000_000_u64)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub max_bps: Option<u64>,
}

/// What a registered identity is.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "kebab-case")]
pub enum HostRole {
    /// Runs the group's deployments, heartbeats, bills.
    #[default]
    Host,
    /// `sluice-host steer`: reads its group's ownership table, nothing
    /// else; not a member of the group.
    Dispatcher,
}

/// The largest packet or bit rate a host may be registered with (10 Tbit/s).
const MAX_HOST_CEILING: u64 = 10_000_000_000_000;

/// Register a host (admin). Only registered hosts are heard: their
/// heartbeats, meter records and events are accepted for deployments
/// placed on their group. With `nats-auth-file` configured, the NATS
/// servers' authorization is rewritten; reload them to let the host in.
#[utoipa::path(post, path = "/v1/hosts", tag = "hosts", security(("bearer" = [])), request_body = HostIn,
    responses((status = 201, body = HostOut), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn register_host(
    State(st): State<AppState>,
    _: Admin,
    body: Result<Json<HostIn>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, Json<HostOut>), ApiError> {
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    check_token("host", &req.id).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_token("group", &req.group).map_err(|e| ApiError::bad_request(e.to_string()))?;
    if let Some(k) = &req.nkey {
        sluice_control::auth::check_user_nkey(k).map_err(ApiError::bad_request)?;
    }
    for (field, v) in [("max_pps", req.max_pps), ("max_bps", req.max_bps)] {
        if v.is_some_and(|v| !(1..=MAX_HOST_CEILING).contains(&v)) {
            return Err(ApiError::bad_request(format!("{field} must be 1 to {MAX_HOST_CEILING}")));
        }
    }
    let row = crate::store::HostRow {
        id: req.id.clone(),
        group: req.group.clone(),
        nkey: req.nkey.clone(),
        created_ms: now(),
        dispatcher: req.role == HostRole::Dispatcher,
        max_pps: req.max_pps,
        max_bps: req.max_bps,
    };
    if !st.store.add_host(&row)? {
        return Err(ApiError::conflict(format!(
            "host '{}' (or its nkey) is registered already; remove it first",
            req.id
        )));
    }
    crate::nats_auth::write(&st.config, &st.store).map_err(ApiError::internal)?;
    tracing::info!(host = %req.id, group = %req.group, role = ?req.role, "host registered");
    let out = HostOut {
        host: req.id,
        group: req.group,
        nkey: req.nkey,
        role: req.role,
        alive: false,
        last_seen_ms_ago: None,
        started_ms: None,
        version: None,
        deployments: 0,
        memory_slot_mb: None,
        max_pps: req.max_pps.unwrap_or(st.config.meters.host_max_pps),
        max_bps: req.max_bps.unwrap_or(st.config.meters.host_max_bps),
    };
    Ok((StatusCode::CREATED, Json(out)))
}

/// Remove a host from the registry (admin): it is no longer heard, and
/// (after the NATS servers reload) no longer let in.
#[utoipa::path(delete, path = "/v1/hosts/{id}", tag = "hosts", security(("bearer" = [])),
    params(("id" = String, Path, description = "Host id", pattern = "^[A-Za-z0-9_-]{1,64}$")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn remove_host(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if !st.store.remove_host(&id)? {
        return Err(ApiError::not_found("host", &id));
    }
    st.hosts.write().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&id);
    crate::nats_auth::write(&st.config, &st.store).map_err(ApiError::internal)?;
    tracing::info!(host = %id, "host removed");
    Ok(StatusCode::NO_CONTENT)
}

/// Messages from hosts the gateway refused (admin): counts by kind and the
/// newest hundred with the reason.
#[utoipa::path(get, path = "/v1/rejects", tag = "hosts", security(("bearer" = [])),
    responses((status = 200, body = crate::intake::RejectsOut), (status = 403, body = ErrorBody)))]
pub async fn rejects(State(st): State<AppState>, _: Admin) -> Json<crate::intake::RejectsOut> {
    Json(st.rejects.snapshot())
}

/// Who the NATS servers let in (admin): the gateway's nkey and every
/// registered host's, with its group and role. `sluice-gateway
/// nats-auth-sync`, beside each server the gateway does not share a
/// machine with, renders the servers' authorization block from it.
#[utoipa::path(get, path = "/v1/nats-authorization", tag = "hosts", security(("bearer" = [])),
    responses((status = 200, body = crate::nats_auth::NatsIdentities), (status = 403, body = ErrorBody), (status = 409, body = ErrorBody)))]
pub async fn nats_authorization(
    State(st): State<AppState>,
    _: Admin,
) -> Result<Json<crate::nats_auth::NatsIdentities>, ApiError> {
    let ids = crate::nats_auth::identities(&st.config, &st.store).map_err(ApiError::internal)?;
    ids.map(Json)
        .ok_or_else(|| ApiError::conflict("this gateway has no nats-nkey: its NATS servers run without authorization"))
}

// ---------------------------------------------------------------- modules

/// An uploaded module.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct ModuleOut {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Version.
    pub version: String,
    /// SHA-256 of the component, hex.
    pub digest: String,
    /// Size in bytes.
    pub size: i64,
    /// The `sluice:nf` contract version it targets.
    pub contract: String,
    /// Uploaded, ms since the epoch.
    pub created_ms: i64,
    /// Deployments using it.
    pub deployed_in: Vec<String>,
}

fn module_out(st: &AppState, m: ModuleRow) -> Result<ModuleOut, ApiError> {
    let deployed_in = st.store.module_users(&m.id)?;
    Ok(ModuleOut {
        id: m.id,
        name: m.name,
        version: m.version,
        digest: m.digest,
        size: m.size,
        contract: m.contract,
        created_ms: m.created_ms,
        deployed_in,
    })
}

/// Name and version of an upload.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct UploadParams {
    /// Module name: 1-64 letters, digits, '-' or '_', starting with a
    /// letter or digit.
    #[param(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub name: String,
    /// Module version: 1-64 letters, digits, '.', '_', '+' or '-'.
    #[param(pattern = "^[A-Za-z0-9._+-]{1,64}$")]
    pub version: String,
}

/// Upload a module (the raw `.wasm` as the body).
///
/// The component is validated, compiled and pre-instantiated against the
/// host's linker, exactly as hosts will load it.
#[utoipa::path(post, path = "/v1/modules", tag = "modules", security(("bearer" = [])), params(UploadParams),
    request_body(content = Vec<u8>, content_type = "application/wasm"),
    responses((status = 201, body = ModuleOut),
        (status = 400, description = "not WebAssembly, or bad name/version", body = ErrorBody),
        (status = 409, description = "name and version exist, or a quota (`quota_exceeded`)", body = ErrorBody),
        (status = 429, description = "too many uploads of this tenant in flight", body = ErrorBody),
        (status = 413, description = "over the size limit", body = ErrorBody),
        (status = 422, description = "a core module, an invalid component, or not the sluice:nf world", body = ErrorBody)))]
pub async fn upload_module(
    State(st): State<AppState>,
    tenant: Result<Tenant, ApiError>,
    query: Result<Query<UploadParams>, axum::extract::rejection::QueryRejection>,
    body: Body,
) -> Result<(StatusCode, [(header::HeaderName, String); 1], Json<ModuleOut>), ApiError> {
    // The body is read before credentials and parameters are judged: a
    // client is still sending it, and answering first would reset the
    // connection under it instead of telling it what is wrong.
    let tenant = match tenant {
        Ok(t) => t,
        Err(e) => {
            // Unauthenticated: discard (a bounded amount), keep nothing.
            drain(body, st.config.max_module_bytes()).await;
            return Err(e);
        }
    };
    let quotas = &st.config.quotas;
    let Some(_turn) = st.upload_turn(&tenant.id, quotas.uploads_in_flight) else {
        drain(body, st.config.max_module_bytes()).await;
        return Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_uploads",
            format!(
                "this tenant has {} uploads being checked already (quotas.uploads-in-flight); retry when one is done",
                quotas.uploads_in_flight
            ),
        ));
    };
    let bytes = read_limited(body, st.config.max_module_bytes()).await?;
    let Query(q) = query
        .map_err(|e| ApiError::bad_request(format!("{}; give ?name=<module name>&version=<version>", e.body_text())))?;
    check_name("module name", &q.name)?;
    check_version(&q.version)?;
    if bytes.is_empty() {
        return Err(ApiError::bad_request("empty body: send the .wasm file as the request body"));
    }
    if st.store.module(&tenant.id, &format!("{}@{}", q.name, q.version))?.is_some() {
        return Err(ApiError::conflict(format!(
            "module {}@{} exists already; versions are immutable, upload under a new version",
            q.name, q.version
        )));
    }
    let held = st.store.modules(&tenant.id)?;
    let held_bytes: u64 = held.iter().map(|m| u64::try_from(m.size).unwrap_or(0)).sum();
    if held.len() >= quotas.modules as usize {
        return Err(quota(format!(
            "this tenant holds {} module versions, its quota (quotas.modules); delete unused ones first",
            held.len()
        )));
    }
    if held_bytes.saturating_add(bytes.len() as u64) > quotas.module_mb << 20 {
        return Err(quota(format!(
            "this tenant's modules would take {} bytes, over its quota of {} MiB (quotas.module-mb); delete unused ones first",
            held_bytes.saturating_add(bytes.len() as u64),
            quotas.module_mb
        )));
    }
    let runtime = st.runtime.clone();
    let name = q.name.clone();
    let data = bytes.clone();
    // Compiling is the gateway's most expensive work: a few at a time.
    let _compile = st.compiles.clone().acquire_owned().await.map_err(ApiError::internal)?;
    let loaded = tokio::task::spawn_blocking(move || runtime.load(&name, &data).map(|m| m.contract_version()))
        .await
        .map_err(ApiError::internal)?;
    let contract = loaded.map_err(|e| match e {
        RuntimeError::NotWasm { .. } => ApiError::bad_request(e.to_string()).with_code("not_wasm"),
        RuntimeError::CoreModule { .. } => ApiError::unprocessable("core_module", e.to_string()),
        RuntimeError::WrongWorld { .. } => ApiError::unprocessable("wrong_world", e.to_string()),
        other => ApiError::unprocessable("invalid_component", other.to_string()),
    })?;
    let digest = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
    let path = st.blob_path(&digest);
    // Blobs are shared by digest between tenants: writing one and adding
    // its row, or removing a row and then the unused blob, happen under
    // one lock, so a concurrent delete never takes a blob just uploaded.
    let _blobs = st.blob_lock.lock().await;
    if !path.exists() {
        let tmp = path.with_extension(format!("tmp-{}", random_hex(4)?));
        tokio::fs::write(&tmp, &bytes).await.map_err(ApiError::internal)?;
        tokio::fs::rename(&tmp, &path).await.map_err(ApiError::internal)?;
    }
    let row = ModuleRow {
        id: format!("m_{}", random_hex(6)?),
        tenant_id: tenant.id.clone(),
        name: q.name.clone(),
        version: q.version.clone(),
        digest,
        size: i64::try_from(bytes.len()).unwrap_or(i64::MAX),
        contract: contract.to_string(),
        created_ms: now(),
    };
    if !st.store.insert_module(&row)? {
        return Err(ApiError::conflict(format!("module {}@{} exists already", q.name, q.version)));
    }
    tracing::info!(tenant = %tenant.id, module = %row.id, name = %row.name, version = %row.version, "module uploaded");
    let location = format!("/v1/modules/{}", row.id);
    Ok((StatusCode::CREATED, [(header::LOCATION, location)], Json(module_out(&st, row)?)))
}

/// Reads a body of at most `limit` bytes. A larger one is read on (up to
/// a hard cap) and discarded before answering 413, so the client gets the
/// answer instead of a connection reset in the middle of its upload.
async fn read_limited(body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let hard_cap = limit.saturating_mul(4).max(limit.saturating_add(64 << 20));
    let mut stream = body.into_data_stream();
    let mut buf = Vec::new();
    let mut total = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| ApiError::bad_request(format!("cannot read the request body: {e}")))?;
        total = total.saturating_add(chunk.len());
        if total <= limit {
            buf.extend_from_slice(&chunk);
        } else if total > hard_cap {
            break;
        }
    }
    if total > limit {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            format!(
                "the module is larger than the {limit}-byte limit (max-module-mb); shrink it (release build, strip) or ask the operator"
            ),
        ));
    }
    Ok(Bytes::from(buf))
}

/// Reads and discards up to `limit` bytes of a body.
async fn drain(body: Body, limit: usize) {
    let mut stream = body.into_data_stream();
    let mut total = 0usize;
    while let Some(Ok(chunk)) = stream.next().await {
        total = total.saturating_add(chunk.len());
        if total > limit {
            break;
        }
    }
}

impl ApiError {
    fn with_code(mut self, code: &'static str) -> Self {
        self.code = code;
        self
    }
}

/// List the tenant's modules by name, then upload time, paged.
#[utoipa::path(get, path = "/v1/modules", tag = "modules", security(("bearer" = [])), params(PageParams),
    responses((status = 200, body = [ModuleOut], headers(("Link" = String, description = "the next page, `<path?limit=N&after=CURSOR>; rel=\"next\"`, while more items follow"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_modules(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let rows = st.store.modules(&tenant.id)?;
    let items = rows
        .into_iter()
        .map(|m| {
            let key = format!("{}\u{1}{}", m.name, created_key(m.created_ms, &m.id));
            module_out(&st, m).map(|o| (key, o))
        })
        .collect::<Result<_, _>>()?;
    page("/v1/modules", items, &p)
}

/// Get a module by id or `name@version`.
#[utoipa::path(get, path = "/v1/modules/{id}", tag = "modules", security(("bearer" = [])),
    params(("id" = String, Path, description = "Module id or name@version")),
    responses((status = 200, body = ModuleOut), (status = 404, body = ErrorBody)))]
pub async fn get_module(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(id): ApiPath<String>,
) -> Result<Json<ModuleOut>, ApiError> {
    let m = st.store.module(&tenant.id, &id)?.ok_or_else(|| ApiError::not_found("module", &id))?;
    Ok(Json(module_out(&st, m)?))
}

/// Delete a module (refused while a deployment uses it).
#[utoipa::path(delete, path = "/v1/modules/{id}", tag = "modules", security(("bearer" = [])),
    params(("id" = String, Path, description = "Module id or name@version")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 409, description = "deployed", body = ErrorBody)))]
pub async fn delete_module(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    let m = st.store.module(&tenant.id, &id)?.ok_or_else(|| ApiError::not_found("module", &id))?;
    let _blobs = st.blob_lock.lock().await;
    match st.store.delete_module(&tenant.id, &m.id)? {
        Err(users) => Err(ApiError::conflict(format!(
            "module {}@{} is used by deployment(s) {}; delete or update them first",
            m.name,
            m.version,
            users.join(", ")
        ))),
        Ok(false) => Err(ApiError::not_found("module", &id)),
        Ok(true) => {
            if !st.store.digest_in_use(&m.digest)? {
                let _ = tokio::fs::remove_file(st.blob_path(&m.digest)).await;
            }
            Ok(StatusCode::NO_CONTENT)
        }
    }
}

// ---------------------------------------------------------------- deployments

/// Limits of one NF; unset ones take the host's defaults. A value out of
/// its range is a 422 `invalid_limit` naming the NF and the field.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LimitsIn {
    /// What a batch the NF failed (trap, deadline, error) becomes:
    /// `fail-open` forwards it, `fail-closed` (hosts' default) drops it.
    #[schema(pattern = "^fail-(open|closed)$")]
    pub failure_policy: Option<String>,
    /// CPU deadline per batch, ms (1-1000; hosts default to 10).
    #[schema(minimum = 1, maximum = 1000)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub deadline_ms: Option<u64>,
    /// Linear memory cap per instance, MiB (1 to the hosts' memory slot,
    /// `max_memory_mb`, 256 by default; hosts default to 64).
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub memory_mb: Option<u64>,
    /// CPU deadline of starting an instance (instantiation and `init`),
    /// ms (1-30000; hosts default to 1000). Language runtimes restoring a
    /// snapshot (Python, JavaScript) need tens of milliseconds.
    #[schema(minimum = 1, maximum = 30000)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub start_deadline_ms: Option<u64>,
    /// Fuel (about one Wasm instruction) per batch call, 0 to 10^12; 0:
    /// unlimited. Counted only on hosts that compile fuel metering in.
    #[schema(minimum = 0, maximum = 1e12)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub fuel: Option<u64>,
    /// Most flows with state per worker (1-16777216 flows).
    #[schema(minimum = 1, maximum = 16_777_216)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub max_flows: Option<u64>,
    /// Largest state value of one flow, bytes (1-65536).
    #[schema(minimum = 1, maximum = 65_536)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub max_flow_state_bytes: Option<u64>,
    /// State budget, MiB (1 to the gateway's `max-state-budget-mb`, 1024
    /// by default; hosts default to 64): each instance's own tables and
    /// flow state, and once more the NF's shared tables on a host.
    #[schema(minimum = 1)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub state_budget_mb: Option<u64>,
    /// Log lines per second per instance, lines/s (0-10000; hosts default
    /// to 50); more are dropped and counted.
    #[schema(minimum = 0, maximum = 10_000)]
    #[serde(default, deserialize_with = "crate::whole::optional")]
    pub log_lines_per_second: Option<u64>,
}

/// One NF of a chain.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NfIn {
    /// Name in the chain (default: the module's name).
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub name: Option<String>,
    /// Module id or `name@version`.
    pub module: String,
    /// The NF's configuration: a string is passed verbatim, anything else as JSON.
    #[schema(value_type = Object)]
    pub config: Option<serde_json::Value>,
    /// NF that gets the forwarded packets (none: they leave the chain).
    pub next: Option<String>,
    /// Label → NF for labelled packets.
    #[serde(default)]
    pub labels: BTreeMap<u16, String>,
    /// Limits.
    #[serde(default)]
    pub limits: LimitsIn,
}

/// A deployment request: one module, or a chain in `nfs`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct DeploymentIn {
    /// Name, unique per tenant (ignored by updates).
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub name: Option<String>,
    /// Host group (default `default`).
    #[schema(pattern = "^[A-Za-z0-9_-]{1,64}$")]
    pub group: Option<String>,
    /// A single module (id or `name@version`) instead of `nfs`.
    pub module: Option<String>,
    /// Its configuration (with `module`).
    #[schema(value_type = Object)]
    pub config: Option<serde_json::Value>,
    /// Its limits (with `module`).
    pub limits: Option<LimitsIn>,
    /// A chain, in order; every route must go forward. Without `next`, an
    /// NF's packets go to the NF after it (the last one's leave).
    #[schema(min_items = 1, max_items = 16)]
    pub nfs: Option<Vec<NfIn>>,
    /// Which traffic of the group's hosts is this deployment's: at most 16
    /// attachments, each the text form `port=0,vlan=100,dst=10.1.0.0/16,out=1`
    /// or the same as an object. Required in a group whose operator exposes
    /// ports (`port` and `out` must be among them, and no two deployments
    /// of the group, of any tenant, may overlap: 409 `attachment_overlap`);
    /// refused in a development group (no exposed ports), whose
    /// deployments see every packet of a host's capture. An update without
    /// it keeps the deployment's attachments; `[]` removes them.
    #[schema(max_items = 16)]
    pub attach: Option<Vec<AttachmentIn>>,
    /// What the NFs see of fragmented IP datagrams: `follow` (default: the
    /// first fragment runs the NFs, the later ones follow its verdict and
    /// rewrites; nothing is buffered) or `reassemble` (the host holds the
    /// fragments until the datagram is whole, within bounded buffers per
    /// deployment and per source, runs the NFs on the whole datagram and
    /// cuts it again as it came). An update without it keeps the
    /// deployment's choice.
    #[schema(value_type = Option<String>, pattern = "^(follow|reassemble)$", example = "reassemble")]
    pub fragments: Option<sluice_runtime::fragments::FragmentMode>,
}

/// A traffic attachment as a request gives it: the text form or an object.
#[derive(Debug, Clone, Serialize, ToSchema)]
#[serde(untagged)]
pub enum AttachmentIn {
    /// `port=0,vlan=100,dst=10.1.0.0/16,out=1`: `port` is required, the
    /// others narrow it (`vlan`, `dst`) or name the egress port (`out`).
    #[schema(example = "port=0,vlan=100,dst=10.1.0.0/16")]
    Text(String),
    /// The same as an object.
    Object(AttachmentObject),
}

/// A traffic attachment as an object.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AttachmentObject {
    /// Ingress port (DPDK port id), one the host group exposes.
    #[serde(deserialize_with = "crate::whole::required")]
    #[schema(maximum = 65535)]
    pub port: u16,
    /// 802.1Q VLAN id of the outer tag: 1-4094 for that VLAN, 0 for
    /// untagged frames only; none: any.
    #[serde(default, deserialize_with = "crate::whole::optional")]
    #[schema(maximum = 4094)]
    pub vlan: Option<u16>,
    /// Destination prefix, IPv4 or IPv6, host bits clear; none: any packet.
    #[serde(default)]
    #[schema(example = "10.1.0.0/16")]
    pub dst: Option<String>,
    /// Egress port (one the group exposes) of forwarded packets the NF
    /// sends nowhere else; none: the host's default.
    #[serde(default, deserialize_with = "crate::whole::optional")]
    #[schema(maximum = 65535)]
    pub out: Option<u16>,
    /// `outside`: packets of this attachment are replies (e.g. to a NAT's
    /// public address) and run a linear chain last NF first; `inside`
    /// (the default): connections are opened from here.
    #[serde(default)]
    #[schema(pattern = "^(inside|outside)$", example = "outside")]
    pub side: Option<String>,
}

impl<'de> Deserialize<'de> for AttachmentIn {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let shown = |v: &serde_json::Value| v.to_string().chars().take(200).collect::<String>();
        match serde_json::Value::deserialize(d)? {
            serde_json::Value::String(s) => Ok(AttachmentIn::Text(s)),
            v @ serde_json::Value::Object(_) => {
                serde_json::from_value(v.clone()).map(AttachmentIn::Object).map_err(|e| {
                    D::Error::custom(format!(
                        "attachment {}: {e} (an object has port and optionally vlan, dst, out, side)",
                        shown(&v)
                    ))
                })
            }
            other => Err(D::Error::custom(format!(
                "attachment {}: give a string such as \"port=0,vlan=100\" or an object such as {{\"port\": 0, \"vlan\": 100}}",
                shown(&other)
            ))),
        }
    }
}

impl AttachmentIn {
    /// The attachment, checked (VLAN range, canonical prefix).
    fn parse(&self) -> Result<Attachment, String> {
        match self {
            AttachmentIn::Text(t) => t.parse::<Attachment>().map_err(|e| e.to_string()),
            AttachmentIn::Object(o) => {
                let dst = o
                    .dst
                    .as_deref()
                    .map(|d| {
                        d.parse::<ipnet::IpNet>()
                            .map_err(|e| format!("attachment: dst '{d}': {e} (give a prefix such as 10.1.0.0/16)"))
                    })
                    .transpose()?;
                let side = match o.side.as_deref() {
                    Some(v) => v.parse().map_err(|e| format!("attachment: {e}"))?,
                    None => sluice_traffic::Side::Inside,
                };
                let a = Attachment { port: o.port, vlan: o.vlan, dst, out: o.out, side };
                a.validate().map_err(|e| e.to_string())?;
                Ok(a)
            }
        }
    }
}

/// The most traffic attachments of one deployment. Every host of the
/// group matches each packet against the attachments of all its
/// deployments, and they travel with the deployment to every host: a
/// short list per deployment keeps both small. A prefix that covers
/// several (`dst=10.0.0.0/8`) counts once.
pub const MAX_ATTACHMENTS: usize = 16;

/// The attachments a request gives, each checked.
fn parse_attachments(list: &[AttachmentIn]) -> Result<Vec<Attachment>, ApiError> {
    if list.len() > MAX_ATTACHMENTS {
        return Err(ApiError::bad_request(format!(
            "{} attachments given; a deployment may have at most {MAX_ATTACHMENTS} (one prefix such as dst=10.0.0.0/8 can cover several)",
            list.len()
        )));
    }
    list.iter()
        .enumerate()
        .map(|(i, a)| a.parse().map_err(|e| ApiError::bad_request(format!("attach[{i}]: {e}"))))
        .collect()
}

/// Checks attachments against the ports `group` exposes: required (on
/// exposed ports only) where it exposes some, refused where it exposes
/// none. Overlaps with other deployments are the store's to check.
fn check_group_attachments(
    config: &crate::config::GatewayConfig,
    group: &str,
    attachments: &[Attachment],
) -> Result<(), ApiError> {
    let exposed = config.exposed_ports(group);
    let list = exposed.iter().map(u16::to_string).collect::<Vec<_>>().join(", ");
    if exposed.is_empty() {
        if attachments.is_empty() {
            return Ok(());
        }
        return Err(ApiError::unprocessable(
            "no_ports_exposed",
            format!(
                "host group '{group}' exposes no ports: it is a development group, whose deployments take no \
                 attachments and see every packet of a host's capture; deploy without attachments (an update \
                 keeps the old ones unless given \"attach\": []), or to a group whose ports the operator exposes"
            ),
        ));
    }
    if attachments.is_empty() {
        return Err(ApiError::unprocessable(
            "attachment_required",
            format!(
                "host group '{group}' shares its ports between tenants: give --attach port=…[,vlan=…][,dst=…] \
                 (API: \"attach\": [\"port=0,vlan=100\"]) to say which of its traffic is this deployment's \
                 (exposed ports: {list})"
            ),
        ));
    }
    sluice_traffic::outside_ports(attachments)
        .map_err(|reason| ApiError::unprocessable("attachment_side", format!("attachments: {reason}")))?;
    for a in attachments {
        for port in std::iter::once(a.port).chain(a.out) {
            if !exposed.contains(&port) {
                return Err(ApiError::unprocessable(
                    "port_not_exposed",
                    format!("attachment '{a}': port {port} is not exposed in host group '{group}' (exposed: {list})"),
                ));
            }
        }
    }
    Ok(())
}

/// Refuses outside attachments for a chain that is not linear: only a
/// linear chain has a reverse order for replies to run.
fn check_reverse(attachments: &[Attachment], nfs: &[NfPlacement]) -> Result<(), ApiError> {
    if attachments.iter().all(|a| a.side.is_inside()) {
        return Ok(());
    }
    let linear = nfs
        .iter()
        .enumerate()
        .all(|(i, n)| n.labels.is_empty() && n.next.as_deref() == nfs.get(i + 1).map(|m| m.name.as_str()));
    if linear {
        return Ok(());
    }
    Err(ApiError::unprocessable(
        "attachment_side",
        "an outside attachment runs the chain in reverse, and only a linear chain (no labels, each NF's next \
         the one after it) has a reverse: attach replies to a deployment of their own, or make the chain linear",
    ))
}

/// One NF of a deployment, resolved.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct NfOut {
    /// Name in the chain.
    pub name: String,
    /// Module id.
    pub module: String,
    /// Module name.
    pub module_name: String,
    /// Module version.
    pub version: String,
    /// Module digest.
    pub digest: String,
    /// Configuration text.
    pub config: String,
    /// Next NF.
    pub next: Option<String>,
    /// Label routes.
    pub labels: BTreeMap<u16, String>,
    /// The limits it asked for (unset ones: the hosts' defaults).
    pub limits: LimitsIn,
}

/// A deployment's state on one host.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct HostStatusOut {
    /// Host id.
    pub host: String,
    /// `pending`, `running` or `failed`.
    pub state: String,
    /// The revision the state is about.
    pub revision: u64,
    /// Why it failed.
    pub reason: Option<String>,
    /// Packets processed on the host.
    pub packets: u64,
}

/// A deployment.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct DeploymentOut {
    /// Id.
    pub id: String,
    /// Name.
    pub name: String,
    /// Host group.
    pub group: String,
    /// Revision (1, then +1 per update).
    pub revision: i64,
    /// The chain.
    pub nfs: Vec<NfOut>,
    /// Which traffic of the group's hosts is its own, in the text form
    /// (`port=0,vlan=100`); empty in a development group.
    pub attachments: Vec<String>,
    /// What its NFs see of fragmented IP datagrams: `follow` or `reassemble`.
    #[schema(value_type = String, example = "follow")]
    pub fragments: sluice_runtime::fragments::FragmentMode,
    /// Overall: `running` (every live host of the group runs this
    /// revision), `failed` (a host could not), or `pending`.
    pub status: String,
    /// Why it is not running, if known.
    pub reason: Option<String>,
    /// Per live host of the group.
    pub hosts: Vec<HostStatusOut>,
    /// Created, ms.
    pub created_ms: i64,
    /// Last changed, ms.
    pub updated_ms: i64,
}

pub(crate) fn deployment_out(st: &AppState, row: DeploymentRow) -> DeploymentOut {
    let revision = u64::try_from(row.revision).unwrap_or(0);
    // What the hosts were given: a host counts as running this revision
    // only if it reports this digest (hosts that report none are older).
    let digest = crate::state::desired_spec(&row).digest();
    let mut hosts = Vec::new();
    for h in st.hosts().into_iter().filter(|h| h.alive(st.silence()) && h.heartbeat.group == row.group) {
        let s = h.heartbeat.deployments.iter().find(|d| d.deployment == row.id);
        hosts.push(HostStatusOut {
            host: h.heartbeat.host.clone(),
            state: match s.map(|s| (s.state, s.digest.as_ref().is_none_or(|d| *d == digest))) {
                Some((HostState::Running, true)) => "running",
                Some((HostState::Running, false)) => "pending",
                Some((HostState::Failed, _)) => "failed",
                _ => "pending",
            }
            .into(),
            revision: s.map(|s| s.revision).unwrap_or(0),
            reason: s.and_then(|s| s.reason.clone()),
            packets: s.map(|s| s.packets).unwrap_or(0),
        });
    }
    let (status, reason) = if let Some(e) = st.publish_error(&row.id) {
        ("failed", Some(format!("cannot be published to its hosts: {e}")))
    } else if hosts.is_empty() {
        ("pending", Some(format!("no live host in group '{}'", row.group)))
    } else if let Some(f) = hosts.iter().find(|h| h.state == "failed" && h.revision == revision) {
        ("failed", f.reason.clone().map(|r| format!("{}: {r}", f.host)))
    } else if hosts.iter().all(|h| h.state == "running" && h.revision == revision) {
        ("running", None)
    } else {
        ("pending", None)
    };
    let nfs = stored_nfs(&row)
        .into_iter()
        .map(|n| NfOut {
            name: n.name,
            module: n.module.id,
            module_name: n.module.name,
            version: n.module.version,
            digest: n.module.digest,
            config: n.config,
            next: n.next,
            labels: n.labels,
            limits: LimitsIn {
                failure_policy: n.limits.failure_policy,
                deadline_ms: n.limits.deadline_ms,
                memory_mb: n.limits.memory_mb,
                start_deadline_ms: n.limits.start_deadline_ms,
                fuel: n.limits.fuel,
                max_flows: n.limits.max_flows,
                max_flow_state_bytes: n.limits.max_flow_state_bytes,
                state_budget_mb: n.limits.state_budget_mb,
                log_lines_per_second: n.limits.log_lines_per_second.map(u64::from),
            },
        })
        .collect();
    DeploymentOut {
        id: row.id,
        name: row.name,
        group: row.group,
        revision: row.revision,
        nfs,
        attachments: row.attachments.iter().map(Attachment::to_string).collect(),
        fragments: row.fragments,
        status: status.into(),
        reason,
        hosts,
        created_ms: row.created_ms,
        updated_ms: row.updated_ms,
    }
}

fn config_text(v: Option<serde_json::Value>) -> String {
    match v {
        None | Some(serde_json::Value::Null) => String::new(),
        Some(serde_json::Value::String(s)) => s,
        Some(other) => other.to_string(),
    }
}

/// The most memory one NF of a deployment in `group` may ask for, MiB, and
/// what sets it (for the error): the gateway's own pool slot, or the
/// smallest slot a live host of the group reports in its heartbeats.
fn memory_ceiling(st: &AppState, group: &str) -> (u64, String) {
    let mut ceiling =
        (st.runtime.config().max_memory_bytes >> 20, " (the hosts' memory slot per instance)".to_string());
    let silence = st.silence();
    for h in st.hosts() {
        let hb = &h.heartbeat;
        if hb.group == group && h.alive(silence) && hb.memory_slot_mb > 0 && hb.memory_slot_mb < ceiling.0 {
            ceiling = (
                hb.memory_slot_mb,
                format!(
                    " (the smallest memory slot of host group '{group}': host '{}' has {} MiB)",
                    hb.host, hb.memory_slot_mb
                ),
            );
        }
    }
    ceiling
}

fn limits_spec(l: LimitsIn, nf: &str, memory: &(u64, String), max_state_mb: u64) -> Result<NfLimitsSpec, ApiError> {
    let invalid = |message: String| ApiError::unprocessable("invalid_limit", message);
    if let Some(p) = &l.failure_policy
        && p != "fail-open"
        && p != "fail-closed"
    {
        return Err(invalid(format!("NF '{nf}': failure_policy '{p}' must be fail-open or fail-closed")));
    }
    let check = |field: &str, v: Option<u64>, lo: u64, hi: u64, what: &str| match v {
        Some(v) if !(lo..=hi).contains(&v) => {
            Err(invalid(format!("NF '{nf}': {field} must be {lo}-{hi}{what}, not {v}")))
        }
        _ => Ok(()),
    };
    check("deadline_ms", l.deadline_ms, 1, 1000, "")?;
    check("memory_mb", l.memory_mb, 1, memory.0, &memory.1)?;
    check("start_deadline_ms", l.start_deadline_ms, 1, 30_000, "")?;
    check("fuel", l.fuel, 0, 1_000_000_000_000, " (0: unlimited)")?;
    check("max_flows", l.max_flows, 1, 1 << 24, "")?;
    check("max_flow_state_bytes", l.max_flow_state_bytes, 1, 65_536, "")?;
    check("state_budget_mb", l.state_budget_mb, 1, max_state_mb, " (the gateway's max-state-budget-mb)")?;
    check("log_lines_per_second", l.log_lines_per_second, 0, 10_000, "")?;
    let log_lines_per_second = l
        .log_lines_per_second
        .map(u32::try_from)
        .transpose()
        .map_err(|_| invalid(format!("NF '{nf}': log_lines_per_second must be 0-10000")))?;
    Ok(NfLimitsSpec {
        failure_policy: l.failure_policy,
        deadline_ms: l.deadline_ms,
        memory_mb: l.memory_mb,
        start_deadline_ms: l.start_deadline_ms,
        fuel: l.fuel,
        max_flows: l.max_flows,
        max_flow_state_bytes: l.max_flow_state_bytes,
        state_budget_mb: l.state_budget_mb,
        log_lines_per_second,
    })
}

/// Resolves a request into the chain hosts will run, checking every module
/// reference, name and route, and starting every NF once with its config
/// (so a config the NF rejects is refused here, not on the hosts).
async fn resolve(
    st: &AppState,
    tenant: &Tenant,
    req: &DeploymentIn,
    group: &str,
) -> Result<(Vec<NfPlacement>, Vec<String>), ApiError> {
    let memory = memory_ceiling(st, group);
    let nfs_in: Vec<NfIn> = match (&req.module, &req.nfs) {
        (Some(m), None) => vec![NfIn {
            name: None,
            module: m.clone(),
            config: req.config.clone(),
            next: None,
            labels: BTreeMap::new(),
            limits: req.limits.clone().unwrap_or_default(),
        }],
        (None, Some(n)) if !n.is_empty() => {
            if req.config.is_some() || req.limits.is_some() {
                return Err(ApiError::bad_request("with 'nfs', give config and limits per NF"));
            }
            n.clone()
        }
        (None, _) => return Err(ApiError::bad_request("give 'module' (one NF) or a non-empty 'nfs' (a chain)")),
        (Some(_), Some(_)) => return Err(ApiError::bad_request("give either 'module' or 'nfs', not both")),
    };
    if nfs_in.len() > 16 {
        return Err(ApiError::bad_request("a chain may have at most 16 NFs"));
    }
    for nf in &nfs_in {
        let size = nf.config.as_ref().map_or(0, |c| match c {
            serde_json::Value::String(s) => s.len(),
            other => other.to_string().len(),
        });
        if size > MAX_CONFIG_BYTES {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "config_too_large",
                format!(
                    "the config of NF '{}' is {size} bytes; an NF's config may be at most {MAX_CONFIG_BYTES} bytes (keep large data in state or a module)",
                    nf.name.as_deref().unwrap_or(&nf.module)
                ),
            ));
        }
    }
    let mut placements = Vec::new();
    let mut module_ids = Vec::new();
    for nf in &nfs_in {
        let m = st.store.module(&tenant.id, &nf.module)?.ok_or_else(|| ApiError::not_found("module", &nf.module))?;
        let name = nf.name.clone().unwrap_or_else(|| m.name.clone());
        check_name("NF name", &name)?;
        if placements.iter().any(|p: &NfPlacement| p.name == name) {
            return Err(ApiError::bad_request(format!("two NFs are named '{name}'; give each a distinct 'name'")));
        }
        module_ids.push(m.id.clone());
        placements.push(NfPlacement {
            name: name.clone(),
            module: ModuleRef {
                id: m.id,
                name: m.name,
                version: m.version,
                digest: m.digest,
                size: u64::try_from(m.size).unwrap_or(0),
            },
            config: config_text(nf.config.clone()),
            next: nf.next.clone(),
            labels: nf.labels.clone(),
            limits: limits_spec(nf.limits.clone(), &name, &memory, st.config.max_state_budget_mb)?,
        });
    }
    // Without explicit routes, a chain is linear.
    if nfs_in.iter().all(|n| n.next.is_none() && n.labels.is_empty()) {
        let names: Vec<String> = placements.iter().map(|p| p.name.clone()).collect();
        for (p, next) in placements.iter_mut().zip(names.iter().skip(1)) {
            p.next = Some(next.clone());
        }
    }
    let index = |to: &str| {
        placements
            .iter()
            .position(|p| p.name == to)
            .ok_or_else(|| ApiError::bad_request(format!("a route names NF '{to}', which is not in the chain")))
    };
    let mut routes = Vec::new();
    for p in &placements {
        let mut labels = Vec::new();
        for (l, to) in &p.labels {
            labels.push((*l, index(to)?));
        }
        routes.push(Routes { next: p.next.as_deref().map(index).transpose()?, labels });
    }
    let names: Vec<&str> = placements.iter().map(|p| p.name.as_str()).collect();
    sluice_runtime::check_routes(&names, &routes).map_err(ApiError::bad_request)?;
    let size = serde_json::to_vec(&placements).map_err(ApiError::internal)?.len();
    if size > MAX_DEPLOYMENT_BYTES {
        return Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "deployment_too_large",
            format!("the chain encodes to {size} bytes; a deployment may be at most {MAX_DEPLOYMENT_BYTES} bytes"),
        ));
    }
    trial_start(st, &placements, routes).await?;
    Ok((placements, module_ids))
}

/// A count or size quota was reached.
fn quota(message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "quota_exceeded", message)
}

/// Checks that `tenant` may hold `nfs` more NF instances in `group` (and,
/// if `new`, one more deployment), not counting deployment `except`.
fn check_deployment_quotas(
    st: &AppState,
    tenant: &Tenant,
    group: &str,
    nfs: usize,
    except: Option<&str>,
) -> Result<(), ApiError> {
    let q = &st.config.quotas;
    let mine = st.store.deployments(&tenant.id)?;
    if except.is_none() && mine.len() >= q.deployments as usize {
        return Err(quota(format!(
            "this tenant has {} deployments, its quota (quotas.deployments); delete one first",
            mine.len()
        )));
    }
    let in_group: usize =
        mine.iter().filter(|d| d.group == group && Some(d.id.as_str()) != except).map(|d| stored_nfs(d).len()).sum();
    if in_group + nfs > q.nfs_per_group as usize {
        return Err(quota(format!(
            "this tenant would run {} NF instances in host group '{group}', over its quota of {} (quotas.nfs-per-group)",
            in_group + nfs,
            q.nfs_per_group
        )));
    }
    Ok(())
}

async fn trial_start(st: &AppState, placements: &[NfPlacement], routes: Vec<Routes>) -> Result<(), ApiError> {
    let mut blobs = Vec::new();
    for p in placements {
        let bytes = tokio::fs::read(st.blob_path(&p.module.digest))
            .await
            .map_err(|e| ApiError::internal(format!("module blob {} is missing: {e}", p.module.digest)))?;
        blobs.push(bytes);
    }
    let runtime = st.runtime.clone();
    let placements = placements.to_vec();
    let _compile = st.compiles.clone().acquire_owned().await.map_err(ApiError::internal)?;
    tokio::task::spawn_blocking(move || -> Result<(), ApiError> {
        let mut specs = Vec::new();
        for (p, bytes) in placements.iter().zip(&blobs) {
            let module = runtime
                .load(&p.name, bytes)
                .map_err(|e| ApiError::unprocessable("invalid_component", e.to_string()))?;
            let mut limits = NfLimits { deadline: Duration::from_secs(1), ..NfLimits::default() };
            // Told at deploy time when its own start deadline is too short.
            if let Some(ms) = p.limits.start_deadline_ms {
                limits.start_deadline = Duration::from_millis(ms);
            }
            if p.limits.failure_policy.as_deref() == Some("fail-open") {
                limits.failure_policy = FailurePolicy::FailOpen;
            }
            if let Some(mb) = p.limits.memory_mb {
                limits.memory_bytes = mb << 20;
            }
            specs.push(NfSpec { module, config: p.config.as_bytes().to_vec().into(), limits, owner: None });
        }
        match Chain::with_routes(&runtime, &specs, routes) {
            Ok(_) => Ok(()),
            Err(e @ RuntimeError::ConfigRejected { .. }) => {
                Err(ApiError::unprocessable("config_rejected", e.to_string()))
            }
            Err(e) => Err(ApiError::unprocessable("start_failed", e.to_string())),
        }
    })
    .await
    .map_err(ApiError::internal)?
}

fn check_granted(st: &AppState, tenant: &Tenant, group: &str) -> Result<(), ApiError> {
    if st.store.grants(&tenant.id)?.iter().any(|g| g == group) {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "group_not_granted",
        format!(
            "this tenant may not deploy to host group '{group}'; GET /v1/me lists its groups, the operator grants others"
        ),
    ))
}

/// The most bytes of one NF's config: it travels to every host of the
/// group with the deployment, and is handed to `init` whole.
pub const MAX_CONFIG_BYTES: usize = 64 * 1024;
/// The most bytes of a deployment's encoded chain (one NATS message,
/// under any server's `max_payload`, 1 MiB by default).
pub const MAX_DEPLOYMENT_BYTES: usize = 512 * 1024;

/// Publishes `groups`; a transient failure is retried every second.
/// Answers the error if `deployment` itself cannot be published (the
/// deployment is then `failed` with it).
async fn publish(st: &AppState, groups: &[&str], deployment: Option<&str>) -> Result<(), ApiError> {
    for g in groups {
        if let Err(e) = st.publish_group(g).await {
            // Stored; retried every second until the bus takes it.
            st.unpublished.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(g.to_string());
            tracing::warn!(group = %g, "deployment stored but not yet published (retrying): {e}");
        }
    }
    match deployment.and_then(|d| st.publish_error(d)) {
        Some(reason) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "publish_failed",
            format!("the deployment was stored but cannot be published to its hosts: {reason}; update or delete it"),
        )),
        None => Ok(()),
    }
}

/// Deploy a module or a chain onto a host group.
#[utoipa::path(post, path = "/v1/deployments", tag = "deployments", security(("bearer" = [])), request_body = DeploymentIn,
    responses((status = 201, body = DeploymentOut), (status = 400, body = ErrorBody),
        (status = 403, description = "the tenant may not deploy to the group (`group_not_granted`)", body = ErrorBody),
        (status = 404, description = "unknown module", body = ErrorBody),
        (status = 409, description = "the name exists, a quota (`quota_exceeded`), or an attachment overlaps one of another deployment of the group (`attachment_overlap`)", body = ErrorBody),
        (status = 413, description = "a config or the chain is too large", body = ErrorBody),
        (status = 422, description = "the NF rejected its configuration (`config_rejected`), a limit is out of its range (`invalid_limit`, naming the NF and the field), or attachments do not fit the group's ports or chain (`attachment_required`, `port_not_exposed`, `no_ports_exposed`, `attachment_side`)", body = ErrorBody),
        (status = 500, description = "stored but cannot be published (the deployment is `failed`)", body = ErrorBody)))]
pub async fn create_deployment(
    State(st): State<AppState>,
    tenant: Tenant,
    body: Result<Json<DeploymentIn>, axum::extract::rejection::JsonRejection>,
) -> Result<(StatusCode, [(header::HeaderName, String); 2], Json<DeploymentOut>), ApiError> {
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let group = req.group.clone().unwrap_or_else(|| "default".into());
    check_token("group", &group).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_granted(&st, &tenant, &group)?;
    let attachments = parse_attachments(req.attach.as_deref().unwrap_or_default())?;
    check_group_attachments(&st.config, &group, &attachments)?;
    check_deployment_quotas(&st, &tenant, &group, req.nfs.as_ref().map_or(1, Vec::len), None)?;
    st.store.check_overlap(&tenant.id, &group, None, &attachments)?;
    let (nfs, module_ids) = resolve(&st, &tenant, &req, &group).await?;
    check_reverse(&attachments, &nfs)?;
    let name = match &req.name {
        Some(n) => n.clone(),
        None => nfs.first().map(|n| n.name.clone()).unwrap_or_default(),
    };
    check_name("deployment name", &name)?;
    if st.store.deployment(&tenant.id, &name)?.is_some() {
        return Err(ApiError::conflict(format!("a deployment named '{name}' exists; update it with PUT")));
    }
    let t = now();
    let row = DeploymentRow {
        id: format!("d_{}", random_hex(6)?),
        tenant_id: tenant.id.clone(),
        name,
        group: group.clone(),
        revision: 1,
        spec: serde_json::to_string(&nfs).map_err(ApiError::internal)?,
        attachments,
        fragments: req.fragments.unwrap_or_default(),
        created_ms: t,
        updated_ms: t,
    };
    st.store.put_deployment(&row, &module_ids)?;
    tracing::info!(tenant = %tenant.id, deployment = %row.id, group = %group, "deployment created");
    publish(&st, &[&group], Some(&row.id)).await?;
    let headers = [(header::LOCATION, format!("/v1/deployments/{}", row.id)), (header::ETAG, etag(row.revision))];
    Ok((StatusCode::CREATED, headers, Json(deployment_out(&st, row))))
}

/// List the tenant's deployments with their status, oldest first, paged.
#[utoipa::path(get, path = "/v1/deployments", tag = "deployments", security(("bearer" = [])), params(PageParams),
    responses((status = 200, body = [DeploymentOut], headers(("Link" = String, description = "the next page, `<path?limit=N&after=CURSOR>; rel=\"next\"`, while more items follow"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody)))]
pub async fn list_deployments(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<PageParams>,
) -> Result<Response, ApiError> {
    let items = st
        .store
        .deployments(&tenant.id)?
        .into_iter()
        .map(|r| (created_key(r.created_ms, &r.id), deployment_out(&st, r)))
        .collect();
    page("/v1/deployments", items, &p)
}

/// Get a deployment (by id or name) with its per-host status.
#[utoipa::path(get, path = "/v1/deployments/{id}", tag = "deployments", security(("bearer" = [])),
    params(("id" = String, Path, description = "Deployment id or name")),
    responses((status = 200, description = "with an ETag of the revision, for If-Match", body = DeploymentOut), (status = 404, body = ErrorBody)))]
pub async fn get_deployment(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(id): ApiPath<String>,
) -> Result<([(header::HeaderName, String); 1], Json<DeploymentOut>), ApiError> {
    let row = st.store.deployment(&tenant.id, &id)?.ok_or_else(|| ApiError::not_found("deployment", &id))?;
    Ok(([(header::ETAG, etag(row.revision))], Json(deployment_out(&st, row))))
}

/// A deployment's entity tag: its revision.
fn etag(revision: i64) -> String {
    format!("\"{revision}\"")
}

/// Checks `If-Match` (an entity tag from GET, or `*`) against the stored
/// revision: 412 if it names another.
fn check_if_match(headers: &HeaderMap, revision: i64) -> Result<(), ApiError> {
    let Some(v) = headers.get(header::IF_MATCH) else { return Ok(()) };
    let v = v.to_str().map_err(|_| ApiError::bad_request("If-Match is not ASCII"))?;
    let current = etag(revision);
    let matches =
        v.split(',').map(str::trim).any(|t| t == "*" || t == current || t.trim_start_matches("W/") == current);
    if matches {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::PRECONDITION_FAILED,
        "precondition_failed",
        format!("If-Match {v} does not match the deployment's current revision {current}; GET it and try again"),
    ))
}

/// Update a deployment: new module versions, configs or chain. Hosts
/// hot-swap NFs whose module or config changed, keeping their state.
/// Without `attach`, the deployment keeps its attachments (checked again
/// if it moves to another group).
#[utoipa::path(put, path = "/v1/deployments/{id}", tag = "deployments", security(("bearer" = [])), request_body = DeploymentIn,
    params(("id" = String, Path, description = "Deployment id or name"),
        ("If-Match" = Option<String>, Header, description = "The ETag of a GET: the update applies only to that revision")),
    responses((status = 200, body = DeploymentOut), (status = 400, body = ErrorBody),
        (status = 403, description = "the tenant may not deploy to the group (`group_not_granted`)", body = ErrorBody),
        (status = 404, body = ErrorBody),
        (status = 409, description = "another update came first, or an attachment overlaps one of another deployment of the group (`attachment_overlap`)", body = ErrorBody),
        (status = 412, description = "If-Match names another revision", body = ErrorBody),
        (status = 413, body = ErrorBody),
        (status = 422, description = "as for POST: `config_rejected`, `invalid_limit`, or attachments that do not fit the group's ports", body = ErrorBody)))]
pub async fn update_deployment(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
    body: Result<Json<DeploymentIn>, axum::extract::rejection::JsonRejection>,
) -> Result<([(header::HeaderName, String); 1], Json<DeploymentOut>), ApiError> {
    let row = st.store.deployment(&tenant.id, &id)?.ok_or_else(|| ApiError::not_found("deployment", &id))?;
    check_if_match(&headers, row.revision)?;
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let group = req.group.clone().unwrap_or_else(|| row.group.clone());
    check_token("group", &group).map_err(|e| ApiError::bad_request(e.to_string()))?;
    check_granted(&st, &tenant, &group)?;
    let attachments = match req.attach.as_deref() {
        Some(list) => parse_attachments(list)?,
        None => row.attachments.clone(),
    };
    check_group_attachments(&st.config, &group, &attachments)?;
    check_deployment_quotas(&st, &tenant, &group, req.nfs.as_ref().map_or(1, Vec::len), Some(&row.id))?;
    st.store.check_overlap(&tenant.id, &group, Some(&row.id), &attachments)?;
    let (nfs, module_ids) = resolve(&st, &tenant, &req, &group).await?;
    check_reverse(&attachments, &nfs)?;
    let spec = serde_json::to_string(&nfs).map_err(ApiError::internal)?;
    // The same deployment again changes nothing (no new revision, nothing
    // published), unless its revision failed: then applying it retries.
    let fragments = req.fragments.unwrap_or(row.fragments);
    if spec == row.spec && group == row.group && attachments == row.attachments && fragments == row.fragments {
        let out = deployment_out(&st, row.clone());
        if out.status != "failed" {
            return Ok(([(header::ETAG, etag(row.revision))], Json(out)));
        }
    }
    let old_group = row.group.clone();
    let new = DeploymentRow {
        group: group.clone(),
        revision: row.revision + 1,
        spec,
        attachments,
        fragments,
        updated_ms: now(),
        ..row
    };
    st.store.put_deployment(&new, &module_ids)?;
    tracing::info!(tenant = %tenant.id, deployment = %new.id, revision = new.revision, "deployment updated");
    if old_group == group {
        publish(&st, &[&group], Some(&new.id)).await?;
    } else {
        publish(&st, &[&group, &old_group], Some(&new.id)).await?;
    }
    Ok(([(header::ETAG, etag(new.revision))], Json(deployment_out(&st, new))))
}

/// Delete a deployment: its hosts stop it after flushing its meters.
#[utoipa::path(delete, path = "/v1/deployments/{id}", tag = "deployments", security(("bearer" = [])),
    params(("id" = String, Path, description = "Deployment id or name"),
        ("If-Match" = Option<String>, Header, description = "The ETag of a GET: delete only that revision")),
    responses((status = 204), (status = 404, body = ErrorBody), (status = 412, body = ErrorBody)))]
pub async fn delete_deployment(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiPath(id): ApiPath<String>,
    headers: HeaderMap,
) -> Result<StatusCode, ApiError> {
    let row = st.store.deployment(&tenant.id, &id)?.ok_or_else(|| ApiError::not_found("deployment", &id))?;
    check_if_match(&headers, row.revision)?;
    st.store.delete_deployment(&tenant.id, &row.id)?;
    st.publish_errors.lock().unwrap_or_else(std::sync::PoisonError::into_inner).remove(&row.id);
    publish(&st, &[&row.group], None).await?;
    Ok(StatusCode::NO_CONTENT)
}

// ---------------------------------------------------------------- events

/// Which events.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct EventParams {
    /// Only this deployment (id or name).
    pub deployment: Option<String>,
    /// Only this kind, e.g. `firewall.deny`.
    pub kind: Option<String>,
    /// Only events the gateway received since then: RFC 3339 or ms since
    /// the epoch.
    #[param(schema_with = time_param)]
    pub since: Option<String>,
    /// At most this many, newest first (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u64>,
    /// The cursor from the previous page's `Link` header: the (older)
    /// events after it.
    #[param(pattern = "^65(3[0-9]){1,18}$")]
    pub after: Option<String>,
}

/// An event an NF emitted.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct EventOut {
    /// When the gateway received it (RFC 3339, wall clock).
    pub time: String,
    /// The same, ms since the epoch.
    pub time_ms: i64,
    /// The packet's time (RFC 3339; the capture's clock for a replay).
    pub packet_time: String,
    /// Deployment id.
    pub deployment: String,
    /// Deployment name (empty once the deployment is deleted).
    pub deployment_name: String,
    /// NF name in the chain.
    pub nf: String,
    /// Module version.
    pub version: String,
    /// Host that processed the packet.
    pub host: String,
    /// Kind.
    pub kind: String,
    /// Level.
    pub level: String,
    /// Packet time, ns since the epoch.
    pub timestamp_ns: u64,
    /// Flow of the packet.
    pub flow: Option<String>,
    /// The NF's fields.
    pub fields: BTreeMap<String, String>,
}

/// The newest events the tenant's NFs emitted (alerts, denies, ...).
/// Delivery is best effort and the gateway keeps the newest 10,000 per
/// tenant; the exact count of events is in the usage. NF log lines and
/// traps (kinds `sluice.log`, `sluice.trap`) are in `/v1/logs`, and here
/// only when asked for by kind.
/// Paged like every list: while older events follow, a `Link` header
/// names the next page (same filters).
#[utoipa::path(get, path = "/v1/events", tag = "events", security(("bearer" = [])), params(EventParams),
    responses((status = 200, body = [EventOut],
            headers(("Link" = String, description = "the next page, `<path?...&after=CURSOR>; rel=\"next\"`, while more events follow"))),
        (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn events(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<EventParams>,
) -> Result<Response, ApiError> {
    let deployment = match &p.deployment {
        Some(d) => Some(st.store.deployment(&tenant.id, d)?.ok_or_else(|| ApiError::not_found("deployment", d))?.id),
        None => None,
    };
    let limit = p.limit.unwrap_or(100).clamp(1, 1000);
    let since = p.since.as_deref().map(parse_time).transpose()?;
    let before = p.after.as_deref().map(event_cursor).transpose()?;
    // One more than asked says whether another page follows.
    let mut rows = st.store.events(
        &tenant.id,
        deployment.as_deref(),
        p.kind.as_deref(),
        since,
        before,
        limit.saturating_add(1),
    )?;
    let more = rows.len() as u64 > limit;
    rows.truncate(usize::try_from(limit).unwrap_or(1000));
    let next = match (more, rows.last()) {
        (true, Some((seq, ..))) => {
            let mut q: Vec<String> = [("deployment", &p.deployment), ("kind", &p.kind), ("since", &p.since)]
                .into_iter()
                .filter_map(|(k, v)| v.as_ref().map(|v| format!("{k}={}", query_encode(v))))
                .collect();
            q.push(format!("limit={limit}"));
            q.push(format!("after={}", hex::encode(format!("e{seq}"))));
            Some(format!("</v1/events?{}>; rel=\"next\"", q.join("&")))
        }
        _ => None,
    };
    let names: BTreeMap<String, String> =
        st.store.deployments(&tenant.id)?.into_iter().map(|r| (r.id, r.name)).collect();
    let body: Vec<EventOut> = rows
        .into_iter()
        .map(|(_, host, received_ms, e)| EventOut {
            time: rfc3339_ns(i128::from(received_ms) * 1_000_000),
            time_ms: received_ms,
            packet_time: rfc3339_ns(i128::from(e.timestamp_ns)),
            deployment_name: names.get(&e.deployment).cloned().unwrap_or_default(),
            deployment: e.deployment,
            nf: e.nf,
            version: e.version,
            host,
            kind: e.kind,
            level: e.level,
            timestamp_ns: e.timestamp_ns,
            flow: e.flow,
            fields: e.fields,
        })
        .collect();
    let mut resp = Json(body).into_response();
    if let Some(link) = next
        && let Ok(v) = header::HeaderValue::from_str(&link)
    {
        resp.headers_mut().insert(header::LINK, v);
    }
    Ok(resp)
}

/// The event sequence number an events cursor stands for.
fn event_cursor(c: &str) -> Result<i64, ApiError> {
    hex::decode(c)
        .ok()
        .and_then(|b| String::from_utf8(b).ok())
        .and_then(|s| s.strip_prefix('e').and_then(|n| n.parse().ok()))
        .ok_or_else(|| ApiError::bad_request("after is not a cursor this list gave (take it from its Link header)"))
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass).
fn query_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------- NF logs

/// Which log lines.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LogParams {
    /// Only this deployment (id or name).
    pub deployment: Option<String>,
    /// Only this NF (its name in the chain).
    pub nf: Option<String>,
    /// The least level shown: `debug` (default), `info`, `warn` or `error`.
    #[param(pattern = "^(debug|info|warn|error)$")]
    pub level: Option<String>,
    /// Only lines the gateway received since then: RFC 3339 or ms since
    /// the epoch.
    #[param(schema_with = time_param)]
    pub since: Option<String>,
    /// The `next` of an earlier answer: the lines after it, oldest first
    /// (to page forward or follow). Without it: the newest lines.
    #[param(pattern = "^[0-9]{1,18}$")]
    pub after: Option<String>,
    /// At most this many (default 100, at most 1000).
    #[param(minimum = 1, maximum = 1000)]
    pub limit: Option<u64>,
}

/// A line an NF wrote (stdout, stderr, `host-log`) or a trap of it.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogLine {
    /// When the gateway received it (RFC 3339).
    pub time: String,
    /// The same, ms since the epoch.
    pub time_ms: i64,
    /// Deployment id.
    pub deployment: String,
    /// Deployment name (empty if deleted).
    pub deployment_name: String,
    /// NF name in the chain.
    pub nf: String,
    /// Module version.
    pub version: String,
    /// Host it ran on.
    pub host: String,
    /// `debug`, `info`, `warn` or `error` (traps are `error`).
    pub level: String,
    /// `log` (a line the NF wrote) or `trap`.
    pub kind: String,
    /// The line, or what the trap was.
    pub message: String,
    /// Where a line came from: `stdout`, `stderr` or `host-log`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// A trap's cause: `panic`, `deadline exceeded`, `out of memory`,
    /// `stack overflow`, `memory fault`, `out of fuel` or `trap`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cause: Option<String>,
    /// A trap's other fields: `policy` (applied to the batch) and `traps`
    /// (the NF's traps so far on that worker).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fields: BTreeMap<String, String>,
}

/// A page of log lines.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct LogsOut {
    /// Oldest first.
    pub lines: Vec<LogLine>,
    /// Pass as `after` for the lines that come next (none: nothing yet).
    pub next: Option<String>,
}

const LEVELS: [&str; 4] = ["debug", "info", "warn", "error"];

/// The tenant's NF logs: what its NFs wrote to stdout, stderr or
/// `host-log`, and their traps with the cause, from every host, within
/// each NF's log rate (`log_lines_per_second`; lines over it are counted
/// in the usage, not kept). The gateway keeps the newest 10,000 log lines
/// per tenant (apart from its 10,000 events). Another tenant's lines are
/// never shown.
#[utoipa::path(get, path = "/v1/logs", tag = "logs", security(("bearer" = [])), params(LogParams),
    responses((status = 200, body = LogsOut), (status = 400, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn logs(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<LogParams>,
) -> Result<Json<LogsOut>, ApiError> {
    let deployments = st.store.deployments(&tenant.id)?;
    let deployment = match &p.deployment {
        Some(d) => Some(
            deployments
                .iter()
                .find(|r| r.id == *d || r.name == *d)
                .map(|r| r.id.clone())
                .ok_or_else(|| ApiError::not_found("deployment", d))?,
        ),
        None => None,
    };
    let least = p.level.as_deref().unwrap_or("debug").to_ascii_lowercase();
    let from = LEVELS
        .iter()
        .position(|l| *l == least)
        .ok_or_else(|| ApiError::bad_request(format!("level '{least}' is not one of debug, info, warn, error")))?;
    let after = match &p.after {
        Some(a) => Some(a.parse::<i64>().ok().filter(|n| *n >= 0).ok_or_else(|| {
            ApiError::bad_request(format!("after '{a}' is not a cursor: pass the `next` of an earlier answer"))
        })?),
        None => None,
    };
    let q = crate::store::LogQuery {
        deployment: deployment.as_deref(),
        nf: p.nf.as_deref(),
        levels: LEVELS.get(from..).unwrap_or(&[]).to_vec(),
        since_ms: p.since.as_deref().map(parse_time).transpose()?,
        after,
        limit: p.limit.unwrap_or(100).clamp(1, 1000),
    };
    let rows = st.store.logs(&tenant.id, &q)?;
    let names: BTreeMap<&str, &str> = deployments.iter().map(|r| (r.id.as_str(), r.name.as_str())).collect();
    let next = rows.last().map(|r| r.seq.to_string()).or(p.after.clone());
    let lines = rows
        .into_iter()
        .map(|r| {
            let e = r.event;
            let mut fields = e.fields;
            let message = fields.remove("message").unwrap_or_default();
            let source = fields.remove("source");
            let cause = fields.remove("cause");
            LogLine {
                time: rfc3339_ns(i128::from(r.received_ms) * 1_000_000),
                time_ms: r.received_ms,
                deployment_name: names.get(e.deployment.as_str()).map(|n| n.to_string()).unwrap_or_default(),
                deployment: e.deployment,
                nf: e.nf,
                version: e.version,
                host: r.host,
                level: e.level,
                kind: e.kind.trim_start_matches("sluice.").to_string(),
                message,
                source,
                cause,
                fields,
            }
        })
        .collect();
    Ok(Json(LogsOut { lines, next }))
}

// ---------------------------------------------------------------- usage and bills

/// A time range: RFC 3339 or ms since the epoch. Default: everything.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RangeParams {
    /// Start (inclusive), e.g. `2026-11-01T00:00:00Z` or `1793491200000`.
    #[param(schema_with = time_param)]
    pub from: Option<String>,
    /// End (exclusive), after `from`.
    #[param(schema_with = time_param)]
    pub to: Option<String>,
    /// Bucket size of series, ms (default 60000, at least 1000).
    #[param(minimum = 1000)]
    pub step_ms: Option<i64>,
}

/// A time in ns since the epoch as RFC 3339 (empty when out of range).
fn rfc3339_ns(ns: i128) -> String {
    time::OffsetDateTime::from_unix_timestamp_nanos(ns)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// The schema of a time parameter: RFC 3339, or ms since the epoch.
fn time_param() -> utoipa::openapi::schema::Schema {
    use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, OneOfBuilder, Schema, SchemaFormat, Type};
    let one_of = OneOfBuilder::new()
        .item(
            ObjectBuilder::new()
                .schema_type(Type::String)
                .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
                .examples(["2026-11-01T00:00:00Z"]),
        )
        .item(
            ObjectBuilder::new().schema_type(Type::String).pattern(Some("^-?[0-9]{1,18}$")).examples(["1793491200000"]),
        )
        .build();
    Schema::OneOf(one_of)
}

fn parse_time(s: &str) -> Result<i64, ApiError> {
    if let Ok(ms) = s.parse::<i64>() {
        return Ok(ms);
    }
    time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
        .map(|t| (t.unix_timestamp_nanos() / 1_000_000) as i64)
        .map_err(|_| {
            ApiError::bad_request(format!(
                "'{s}' is not a time: use RFC 3339 (2026-11-21T10:00:00Z) or ms since the epoch"
            ))
        })
}

fn range(p: &RangeParams) -> Result<(i64, i64), ApiError> {
    let from = p.from.as_deref().map(parse_time).transpose()?.unwrap_or(0);
    let to = p.to.as_deref().map(parse_time).transpose()?.unwrap_or(i64::MAX);
    if from > to {
        return Err(ApiError::bad_request("'from' must not be after 'to'"));
    }
    Ok((from, to))
}

/// Usage of one NF version in one deployment.
#[derive(Debug, Default, Clone, Serialize, Deserialize, ToSchema)]
pub struct UsageRow {
    /// Deployment id.
    pub deployment: String,
    /// Deployment name (empty if deleted).
    pub deployment_name: String,
    /// NF name in the chain.
    pub nf: String,
    /// Module name.
    pub module: String,
    /// Module version.
    pub version: String,
    /// `process` calls (one per batch).
    pub invocations: u64,
    /// Packets handed to the NF.
    pub packets: u64,
    /// Of them: forwarded by the NF (to a port or the next NF of the chain).
    #[serde(default)]
    pub forwarded: u64,
    /// Of them: dropped by the NF.
    #[serde(default)]
    pub dropped: u64,
    /// Of them: in batches the NF failed (trap, deadline, error), handled
    /// by its failure policy (forwarded under fail-open, dropped under
    /// fail-closed).
    #[serde(default)]
    pub policy: u64,
    /// Of the forwarded: rewritten by the NF (headers or payload changed).
    #[serde(default)]
    pub rewritten: u64,
    /// Bytes.
    pub bytes: u64,
    /// Guest CPU time, ns.
    pub cpu_ns: u64,
    /// Flow-state and state-table operations.
    pub state_ops: u64,
    /// Traps.
    pub traps: u64,
    /// Traps by cause (`deadline exceeded`, `out of memory`, `panic`, ...).
    #[serde(default)]
    pub trap_causes: BTreeMap<String, u64>,
    /// Batches refused by the NF.
    pub errors: u64,
    /// Events emitted.
    pub events: u64,
    /// State held (the NF's tables and flow state: keys, values and a
    /// fixed per-entry overhead) times the time it was held, byte-ms
    /// (saturates at 2^64 - 1, about 5,124 GB-hours; `state_gb_hours` does
    /// not).
    #[serde(default)]
    pub state_byte_ms: u64,
    /// The same in GB-hours (10^9 bytes for an hour), as billed.
    #[serde(default)]
    pub state_gb_hours: f64,
    /// State held at the end of the latest meter window in the range,
    /// bytes (a gauge, not a sum): each host's latest record of the
    /// deployment's NF, counted in the row of the module version that host
    /// ran then, summed over hosts; 0 in rows of versions no host ran
    /// last. In `total`: the sum of the rows.
    #[serde(default)]
    pub state_bytes: u64,
    /// Meter records summed.
    pub records: u64,
}

fn usage_row(u: UsageSums, names: &BTreeMap<String, String>) -> UsageRow {
    UsageRow {
        deployment_name: names.get(&u.deployment).cloned().unwrap_or_default(),
        deployment: u.deployment,
        nf: u.nf,
        module: u.module,
        version: u.version,
        invocations: u.sums.invocations,
        packets: u.sums.packets,
        forwarded: u.sums.forwarded,
        dropped: u.sums.dropped,
        policy: u.sums.policy,
        rewritten: u.sums.rewritten,
        bytes: u.sums.bytes,
        cpu_ns: u.sums.cpu_ns,
        state_ops: u.sums.state_ops,
        traps: u.sums.traps,
        trap_causes: u.trap_causes,
        errors: u.sums.errors,
        events: u.sums.events,
        state_byte_ms: u.sums.state_byte_ms,
        state_gb_hours: billing::gb_hours(u.state_byte_ms),
        state_bytes: u.state_bytes,
        records: u.records,
    }
}

/// A tenant's usage over a range.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageOut {
    /// Tenant id.
    pub tenant: String,
    /// Range start, ms.
    pub from_ms: i64,
    /// Range end, ms.
    pub to_ms: i64,
    /// By deployment, NF and version.
    pub rows: Vec<UsageRow>,
    /// Sums of the rows.
    pub total: UsageRow,
}

fn usage_of(st: &AppState, tenant: &Tenant, from: i64, to: i64) -> Result<(Vec<UsageRow>, UsageSums), ApiError> {
    let sums = st.store.usage(&tenant.id, from, to)?;
    let total = billing::sum(&sums);
    let names: BTreeMap<String, String> =
        st.store.deployments(&tenant.id)?.into_iter().map(|d| (d.id, d.name)).collect();
    Ok((sums.into_iter().map(|u| usage_row(u, &names)).collect(), total))
}

/// Usage by deployment, NF and version (meter windows starting in the range).
#[utoipa::path(get, path = "/v1/usage", tag = "usage", security(("bearer" = [])), params(RangeParams),
    responses((status = 200, body = UsageOut), (status = 400, body = ErrorBody)))]
pub async fn usage(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<RangeParams>,
) -> Result<Json<UsageOut>, ApiError> {
    let (from, to) = range(&p)?;
    let (rows, total) = usage_of(&st, &tenant, from, to)?;
    Ok(Json(UsageOut { tenant: tenant.id, from_ms: from, to_ms: to, rows, total: usage_row(total, &BTreeMap::new()) }))
}

/// One bucket of a series.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct PointOut {
    /// Bucket start, ms.
    pub t_ms: i64,
    /// Packets.
    pub packets: u64,
    /// Bytes.
    pub bytes: u64,
    /// Guest CPU, ns.
    pub cpu_ns: u64,
    /// Invocations.
    pub invocations: u64,
}

/// The series of one NF version.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct SeriesOut {
    /// NF.
    pub nf: String,
    /// Version.
    pub version: String,
    /// Buckets with data, in time order.
    pub points: Vec<PointOut>,
}

/// Usage over time.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct UsageSeriesOut {
    /// Bucket size, ms.
    pub step_ms: i64,
    /// Per NF and version.
    pub series: Vec<SeriesOut>,
}

/// Usage over time, bucketed, per NF and version (for charts).
#[utoipa::path(get, path = "/v1/usage/series", tag = "usage", security(("bearer" = [])), params(RangeParams),
    responses((status = 200, body = UsageSeriesOut), (status = 400, body = ErrorBody)))]
pub async fn usage_series(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<RangeParams>,
) -> Result<Json<UsageSeriesOut>, ApiError> {
    let (from, to) = range(&p)?;
    let step = p.step_ms.unwrap_or(60_000);
    if step < 1000 {
        return Err(ApiError::bad_request("step_ms must be at least 1000"));
    }
    let mut series: Vec<SeriesOut> = Vec::new();
    for pt in st.store.series(&tenant.id, from, to, step)? {
        let point = PointOut {
            t_ms: pt.t_ms,
            packets: pt.packets,
            bytes: pt.bytes,
            cpu_ns: pt.cpu_ns,
            invocations: pt.invocations,
        };
        match series.iter_mut().find(|s| s.nf == pt.nf && s.version == pt.version) {
            Some(s) => s.points.push(point),
            None => series.push(SeriesOut { nf: pt.nf, version: pt.version, points: vec![point] }),
        }
    }
    Ok(Json(UsageSeriesOut { step_ms: step, series }))
}

/// Which bill.
#[derive(Debug, Deserialize, IntoParams)]
#[into_params(parameter_in = Query)]
pub struct BillParams {
    /// Month, `YYYY-MM` (UTC).
    #[param(pattern = "^[0-9]{4}-(0[1-9]|1[0-2])$", example = "2026-11")]
    pub period: String,
    /// `json` (default) or `csv`.
    #[param(pattern = "^(json|csv)$")]
    pub format: Option<String>,
}

/// A bill.
#[derive(Debug, Serialize, Deserialize, ToSchema)]
pub struct BillOut {
    /// Tenant id.
    pub tenant: String,
    /// Tenant name.
    pub tenant_name: String,
    /// `YYYY-MM`.
    pub period: String,
    /// Period start, ms.
    pub from_ms: i64,
    /// Period end, ms.
    pub to_ms: i64,
    /// Currency (ISO 4217 code as the plan gives it): amounts are in its
    /// minor units.
    pub currency: String,
    /// Priced items.
    pub lines: Vec<BillLine>,
    /// Amount due in the currency's minor units (cents for USD): the sum
    /// of the lines' `amount_minor`.
    pub total_minor: i64,
    /// Amount due as a decimal string with the currency's minor digits
    /// (`"12.34"`).
    #[schema(example = "12.34")]
    pub total: String,
    /// The usage billed, by deployment, NF and version.
    pub usage: Vec<UsageRow>,
}

/// The bill of a period, priced by the gateway's plan (JSON or CSV).
#[utoipa::path(get, path = "/v1/bill", tag = "usage", security(("bearer" = [])), params(BillParams),
    responses((status = 200, description = "the bill: JSON, or CSV with format=csv (or Accept: text/csv)",
            content((BillOut = "application/json"), (String = "text/csv"))),
        (status = 400, body = ErrorBody)))]
pub async fn bill(
    State(st): State<AppState>,
    tenant: Tenant,
    ApiQuery(p): ApiQuery<BillParams>,
    headers: HeaderMap,
) -> Result<Response, ApiError> {
    let (from, to) = billing::period_range(&p.period).map_err(ApiError::bad_request)?;
    let (rows, total) = usage_of(&st, &tenant, from, to)?;
    let plan = &st.config.billing;
    let lines = billing::lines(plan, &total);
    let csv = match p.format.as_deref() {
        Some("csv") => true,
        Some("json") => false,
        Some(other) => return Err(ApiError::bad_request(format!("format '{other}' is not json or csv"))),
        None => headers.get(header::ACCEPT).and_then(|a| a.to_str().ok()).is_some_and(|a| a.starts_with("text/csv")),
    };
    let out = BillOut {
        tenant: tenant.id.clone(),
        tenant_name: tenant.name.clone(),
        period: p.period.clone(),
        from_ms: from,
        to_ms: to,
        currency: plan.currency.code().to_string(),
        total_minor: billing::total_minor(&lines),
        total: plan.currency.format(billing::total_minor(&lines)),
        lines,
        usage: rows,
    };
    if !csv {
        return Ok(Json(out).into_response());
    }
    let f = billing::csv_field;
    let mut text = String::from("tenant,period,item,unit,quantity,included,billable,unit_price,amount,currency\n");
    for l in &out.lines {
        text.push_str(&format!(
            "{},{},{},{},{:.6},{:.6},{:.6},{},{},{}\n",
            f(&out.tenant_name),
            out.period,
            f(&l.item),
            f(&l.unit),
            l.quantity,
            l.included,
            l.billable,
            l.unit_price,
            l.amount,
            f(&out.currency)
        ));
    }
    text.push_str(&format!("{},{},total,,,,,,{},{}\n", f(&out.tenant_name), out.period, out.total, f(&out.currency)));
    let filename = format!("attachment; filename=\"sluice-bill-{}-{}.csv\"", out.tenant_name, out.period);
    Ok(([(header::CONTENT_TYPE, "text/csv; charset=utf-8".to_string()), (header::CONTENT_DISPOSITION, filename)], text)
        .into_response())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn attach(json: serde_json::Value) -> Result<Vec<Attachment>, ApiError> {
        let req: DeploymentIn = serde_json::from_value(serde_json::json!({ "module": "m@1", "attach": json }))
            .map_err(|e| ApiError::bad_request(e.to_string()))?;
        parse_attachments(&req.attach.unwrap_or_default())
    }

    #[test]
    fn attachments_come_as_text_or_objects() {
        let got = attach(serde_json::json!([
            "port=0,vlan=100,dst=10.1.0.0/16,out=1",
            { "port": 1, "vlan": 0, "dst": "2001:db8::/32" },
            { "port": 1 },
            { "port": 2, "dst": "203.0.113.1/32", "out": 0, "side": "outside" }
        ]))
        .unwrap();
        let text: Vec<String> = got.iter().map(Attachment::to_string).collect();
        assert_eq!(
            text,
            [
                "port=0,vlan=100,dst=10.1.0.0/16,out=1",
                "port=1,vlan=0,dst=2001:db8::/32",
                "port=1",
                "port=2,dst=203.0.113.1/32,out=0,side=outside"
            ]
        );
        // Each mistake is named.
        for (bad, says) in [
            (serde_json::json!(["port=0,vlan=4095"]), "VLAN 4095"),
            (serde_json::json!(["vlan=1"]), "no port="),
            (serde_json::json!([{ "port": 0, "dst": "10.0.0.1/8" }]), "write 10.0.0.0/8"),
            (serde_json::json!([{ "port": 0, "dst": "ten" }]), "dst 'ten'"),
            (serde_json::json!([{ "port": 0, "colour": "red" }]), "unknown field `colour`"),
            (serde_json::json!([7]), "give a string"),
            (serde_json::json!([{ "port": 0, "side": "up" }]), "give inside or outside"),
        ] {
            let e = attach(bad.clone()).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST);
            assert!(e.message.contains(says), "{bad}: {}", e.message);
        }
        let many: Vec<String> = (0..17).map(|v| format!("port=0,vlan={}", v + 1)).collect();
        assert!(attach(serde_json::json!(many)).unwrap_err().message.contains("at most 16"));
    }

    #[test]
    fn the_bill_is_documented_as_json_and_as_csv() {
        use utoipa::OpenApi;
        let doc = serde_json::to_value(crate::ApiDoc::openapi()).unwrap();
        let content = &doc["paths"]["/v1/bill"]["get"]["responses"]["200"]["content"];
        assert!(content["application/json"]["schema"].to_string().contains("BillOut"), "{content}");
        assert!(content["text/csv"].is_object(), "{content}");
    }

    #[test]
    fn the_openapi_document_shows_both_attachment_forms() {
        use utoipa::OpenApi;
        let doc = serde_json::to_value(crate::ApiDoc::openapi()).unwrap();
        let schemas = &doc["components"]["schemas"];
        let forms = schemas["AttachmentIn"]["oneOf"].to_string();
        assert!(forms.contains("\"string\"") && forms.contains("AttachmentObject"), "{forms}");
        assert!(schemas["DeploymentIn"]["properties"]["attach"].to_string().contains("AttachmentIn"));
        assert!(schemas["DeploymentOut"]["required"].to_string().contains("attachments"));
        assert!(schemas["AttachmentObject"]["properties"]["dst"].is_object());
    }

    #[test]
    fn every_limit_reaches_the_spec_and_each_bound_is_a_422_naming_nf_and_field() {
        let l: LimitsIn = serde_json::from_value(serde_json::json!({
            "failure_policy": "fail-open", "deadline_ms": 1000, "memory_mb": 256, "start_deadline_ms": 30000,
            "fuel": 1_000_000_000_000u64, "max_flows": 16_777_216, "max_flow_state_bytes": 65536,
            "state_budget_mb": 1024, "log_lines_per_second": 0
        }))
        .unwrap();
        let spec = limits_spec(l, "fw", &(256, String::new()), 1024).unwrap();
        assert_eq!(
            spec,
            NfLimitsSpec {
                failure_policy: Some("fail-open".into()),
                deadline_ms: Some(1000),
                memory_mb: Some(256),
                start_deadline_ms: Some(30_000),
                fuel: Some(1_000_000_000_000),
                max_flows: Some(16_777_216),
                max_flow_state_bytes: Some(65_536),
                state_budget_mb: Some(1024),
                log_lines_per_second: Some(0),
            }
        );
        assert_eq!(
            limits_spec(LimitsIn::default(), "fw", &(256, String::new()), 1024).unwrap(),
            NfLimitsSpec::default()
        );
        for (field, bad, says) in [
            ("failure_policy", serde_json::json!("fail-maybe"), "fail-open or fail-closed"),
            ("deadline_ms", serde_json::json!(0), "1-1000, not 0"),
            ("deadline_ms", serde_json::json!(1001), "1-1000, not 1001"),
            ("memory_mb", serde_json::json!(257), "1-256"),
            ("start_deadline_ms", serde_json::json!(0), "1-30000, not 0"),
            ("start_deadline_ms", serde_json::json!(30_001), "1-30000"),
            ("fuel", serde_json::json!(1_000_000_000_001u64), "0-1000000000000 (0: unlimited)"),
            ("max_flows", serde_json::json!(0), "1-16777216"),
            ("max_flows", serde_json::json!(16_777_217), "1-16777216"),
            ("max_flow_state_bytes", serde_json::json!(0), "1-65536"),
            ("max_flow_state_bytes", serde_json::json!(65_537), "1-65536"),
            ("state_budget_mb", serde_json::json!(0), "1-1024"),
            ("state_budget_mb", serde_json::json!(1025), "max-state-budget-mb"),
            ("log_lines_per_second", serde_json::json!(10_001), "0-10000"),
            ("log_lines_per_second", serde_json::json!(5_000_000_000u64), "0-10000"),
        ] {
            let l: LimitsIn = serde_json::from_value(serde_json::json!({ field: bad })).unwrap();
            let e = limits_spec(l, "fw", &(256, String::new()), 1024).unwrap_err();
            assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, "invalid_limit"), "{field}={bad}");
            assert!(e.message.starts_with(&format!("NF 'fw': {field}")), "{field}={bad}: {}", e.message);
            assert!(e.message.contains(says), "{field}={bad}: {}", e.message);
        }
        // The gateway's own bound on state budgets applies.
        let l = LimitsIn { state_budget_mb: Some(100), ..LimitsIn::default() };
        assert!(limits_spec(l, "fw", &(256, String::new()), 64).unwrap_err().message.contains("1-64"));
        // Unknown limits are refused by name.
        let e = serde_json::from_value::<LimitsIn>(serde_json::json!({ "stack_mb": 1 })).unwrap_err();
        assert!(e.to_string().contains("unknown field `stack_mb`"), "{e}");
    }

    #[test]
    fn the_openapi_document_gives_each_limit_its_range() {
        use utoipa::OpenApi;
        let doc = serde_json::to_value(crate::ApiDoc::openapi()).unwrap();
        let p = &doc["components"]["schemas"]["LimitsIn"]["properties"];
        for (field, min, max) in [
            ("deadline_ms", 1.0, Some(1000.0)),
            ("start_deadline_ms", 1.0, Some(30_000.0)),
            ("fuel", 0.0, Some(1e12)),
            ("max_flows", 1.0, Some(16_777_216.0)),
            ("max_flow_state_bytes", 1.0, Some(65_536.0)),
            ("log_lines_per_second", 0.0, Some(10_000.0)),
            ("memory_mb", 1.0, None),
            ("state_budget_mb", 1.0, None),
        ] {
            assert_eq!(p[field]["minimum"].as_f64(), Some(min), "{field}: {}", p[field]);
            assert_eq!(p[field]["maximum"].as_f64(), max, "{field}: {}", p[field]);
            assert!(p[field]["description"].as_str().is_some_and(|d| d.contains('(')), "{field}: {}", p[field]);
        }
        let usage = &doc["components"]["schemas"]["UsageRow"]["properties"];
        for field in ["state_byte_ms", "state_gb_hours", "state_bytes"] {
            assert!(usage[field]["description"].is_string(), "{field}: {usage}");
        }
    }

    #[test]
    fn attachments_must_fit_the_groups_ports() {
        let config: crate::config::GatewayConfig =
            toml::from_str("admin-token = 'secret-token'\n[groups.edge]\nports = [0, 1]\n").unwrap();
        let a = |t: &str| vec![t.parse::<Attachment>().unwrap()];
        check_group_attachments(&config, "edge", &a("port=0,vlan=100,out=1")).unwrap();
        check_group_attachments(&config, "default", &[]).unwrap();
        for (group, list, code, says) in [
            ("edge", vec![], "attachment_required", "shares its ports between tenants"),
            ("edge", a("port=3"), "port_not_exposed", "port 3 is not exposed in host group 'edge' (exposed: 0, 1)"),
            ("edge", a("port=0,out=2"), "port_not_exposed", "port 2 is not exposed"),
            ("default", a("port=0"), "no_ports_exposed", "development group"),
            (
                "edge",
                [a("port=1,out=0"), a("port=1,dst=203.0.113.1/32,out=0,side=outside")].concat(),
                "attachment_side",
                "port 1 is attached both inside and outside",
            ),
        ] {
            let e = check_group_attachments(&config, group, &list).unwrap_err();
            assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, code));
            assert!(e.message.contains(says), "{}", e.message);
        }
    }

    #[test]
    fn only_a_linear_chain_takes_an_outside_attachment() {
        let place = |name: &str, next: Option<&str>, labels: &[(u16, &str)]| NfPlacement {
            name: name.into(),
            module: ModuleRef { id: "m".into(), name: name.into(), version: "1".into(), digest: "d".into(), size: 1 },
            config: String::new(),
            next: next.map(Into::into),
            labels: labels.iter().map(|(l, t)| (*l, t.to_string())).collect(),
            limits: NfLimitsSpec::default(),
        };
        let a = |t: &str| t.parse::<Attachment>().unwrap();
        let outside = [a("port=0,out=1"), a("port=1,out=0,side=outside")];
        let linear = [place("fw", Some("nat"), &[]), place("nat", None, &[])];
        check_reverse(&outside, &linear).unwrap();
        let branching = [place("fw", Some("nat"), &[(1, "nat")]), place("nat", None, &[])];
        let e = check_reverse(&outside, &branching).unwrap_err();
        assert_eq!((e.status, e.code), (StatusCode::UNPROCESSABLE_ENTITY, "attachment_side"));
        check_reverse(&outside[..1], &branching).unwrap();
    }
}
