//! The HTTP API under `/v1`, documented by the OpenAPI document generated
//! from these handlers (`/openapi.json`, Swagger UI at `/docs`).
//!
//! One file per resource: [`tenants`], [`keys`], [`signin`] (dashboard
//! links), [`hosts`], [`groups`], [`modules`], [`deployments`], [`events`],
//! [`logs`], [`usage`] (and bills), [`health`] (readiness). This file holds
//! the `/v1` routes, the OpenAPI document and what the resources share:
//! name checks, paging and time parameters. Every handler and type is
//! re-exported here, at `api::<name>`.

mod deployments;
mod events;
mod groups;
mod health;
mod hosts;
mod keys;
mod logs;
mod modules;
mod signin;
mod tenants;
#[cfg(test)]
mod tests;
mod usage;

pub use deployments::*;
pub use events::*;
pub use groups::*;
pub(crate) use health::readyz;
pub use hosts::*;
pub use keys::*;
pub use logs::*;
pub use modules::*;
pub use signin::*;
pub use tenants::*;
pub use usage::*;

use crate::error::ApiError;
use crate::state::AppState;
use axum::extract::DefaultBodyLimit;
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post, put};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use utoipa::IntoParams;
use utoipa::OpenApi;
use utoipa::openapi::security::{Http, HttpAuthScheme, SecurityScheme};

/// The routes under `/v1`.
pub(crate) fn router() -> Router<AppState> {
    Router::new()
        .route("/tenants", post(tenants::create_tenant).get(tenants::list_tenants))
        .route("/tenants/{id}/keys", post(keys::create_key).get(keys::tenant_keys))
        .route("/tenants/{id}/keys/{prefix}", delete(keys::revoke_tenant_key))
        .route("/tenants/{id}/groups", put(tenants::set_grants))
        .route("/me", get(tenants::me))
        .route("/me/keys", get(keys::my_keys).post(keys::add_my_key))
        .route("/me/dashboard-link", post(signin::dashboard_link))
        .route("/dashboard/session", post(signin::dashboard_session))
        .route("/me/keys/rotate", post(keys::rotate_my_key))
        .route("/me/keys/{prefix}", delete(keys::revoke_my_key))
        .route("/hosts", get(hosts::list_hosts).post(hosts::register_host))
        .route("/hosts/{id}", delete(hosts::remove_host))
        .route("/rejects", get(hosts::rejects))
        .route("/nats-authorization", get(hosts::nats_authorization))
        .route("/groups", get(groups::list_groups))
        .route("/groups/{group}", get(groups::get_group))
        .route("/groups/{group}/settings", put(groups::set_settings))
        .route("/groups/{group}/capacity", post(groups::add_capacity))
        .route("/groups/{group}/hosts/{host}/drain", post(groups::drain).delete(groups::undrain))
        .route("/modules", post(modules::upload_module).get(modules::list_modules).layer(DefaultBodyLimit::disable()))
        .route("/modules/{id}", get(modules::get_module).delete(modules::delete_module))
        .route("/deployments", post(deployments::create_deployment).get(deployments::list_deployments))
        .route(
            "/deployments/{id}",
            get(deployments::get_deployment).put(deployments::update_deployment).delete(deployments::delete_deployment),
        )
        .route("/events", get(events::events))
        .route("/logs", get(logs::logs))
        .route("/usage", get(usage::usage))
        .route("/usage/series", get(usage::usage_series))
        .route("/bill", get(usage::bill))
}

struct BearerAuth;

impl utoipa::Modify for BearerAuth {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme("bearer", SecurityScheme::Http(Http::new(HttpAuthScheme::Bearer)));
        // Every operation that takes a credential answers 401 without a
        // valid one: documented once here rather than on each path.
        let unauthorized = utoipa::openapi::ResponseBuilder::new()
            .description("no credential, or one the gateway does not know (`unauthorized`)")
            .content(
                "application/json",
                utoipa::openapi::Content::new(Some(utoipa::openapi::Ref::from_schema_name("ErrorBody"))),
            )
            .build();
        for item in openapi.paths.paths.values_mut() {
            let ops = [&mut item.get, &mut item.put, &mut item.post, &mut item.delete, &mut item.patch];
            for op in ops.into_iter().flatten() {
                if op.security.as_ref().is_some_and(|s| !s.is_empty()) {
                    op.responses.responses.entry("401".into()).or_insert_with(|| unauthorized.clone().into());
                }
            }
        }
    }
}

/// The OpenAPI document.
#[derive(OpenApi)]
#[openapi(
    info(title = "Sluice gateway", description = "Upload WebAssembly network functions, deploy them onto host groups, read usage and bills. Authenticate with `Authorization: Bearer <API key>` (tenants) or the admin token (tenant management)."),
    paths(
        tenants::create_tenant, tenants::list_tenants, keys::create_key, tenants::me, tenants::set_grants,
        signin::dashboard_link, signin::dashboard_session,
        keys::tenant_keys, keys::revoke_tenant_key, keys::my_keys, keys::add_my_key, keys::rotate_my_key, keys::revoke_my_key,
        hosts::list_hosts, hosts::register_host, hosts::remove_host, hosts::rejects, hosts::nats_authorization,
        groups::list_groups, groups::get_group, groups::set_settings, groups::add_capacity, groups::drain, groups::undrain,
        modules::upload_module, modules::list_modules, modules::get_module, modules::delete_module,
        deployments::create_deployment, deployments::list_deployments, deployments::get_deployment, deployments::update_deployment, deployments::delete_deployment,
        events::events, logs::logs, usage::usage, usage::usage_series, usage::bill,
    ),
    modifiers(&BearerAuth),
    tags((name = "tenants"), (name = "hosts"), (name = "groups"), (name = "modules"), (name = "deployments"), (name = "events"), (name = "logs"), (name = "usage"))
)]
pub struct ApiDoc;

// ---------------------------------------------------------------- names and quotas

/// Ms since the epoch, now.
fn now() -> i64 {
    i64::try_from(sluice_control::now_ms()).unwrap_or(i64::MAX)
}

/// Checks a name (of a tenant, module, NF or deployment) by the one rule
/// ([`sluice_traffic::check_name`]).
fn check_name(what: &str, s: &str) -> Result<(), ApiError> {
    sluice_traffic::check_name(what, s).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// Checks a module version ([`sluice_traffic::check_version`]).
fn check_version(v: &str) -> Result<(), ApiError> {
    sluice_traffic::check_version(v).map_err(|e| ApiError::bad_request(e.to_string()))
}

/// A count or size quota was reached.
fn quota(message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "quota_exceeded", message)
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

// ---------------------------------------------------------------- time parameters

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

/// A time parameter (RFC 3339, or ms since the epoch) in ms since the epoch.
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
