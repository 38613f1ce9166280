//! Hosts (admin): the registry of hosts and dispatchers with their
//! liveness, the messages the gateway refused from hosts, and the NATS
//! identities the servers let in.

use super::{PageParams, now, page};
use crate::auth::Admin;
use crate::error::{ApiError, ApiPath, ApiQuery, ErrorBody};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::{Deserialize, Serialize};
use sluice_control::subjects::check_token;
use std::collections::BTreeMap;
use utoipa::ToSchema;

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
    let seen: BTreeMap<String, crate::model::HostSeen> =
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
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
    pub id: String,
    /// The group it serves.
    #[schema(pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")]
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
    params(("id" = String, Path, description = "Host id", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn remove_host(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(id): ApiPath<String>,
) -> Result<StatusCode, ApiError> {
    if !st.store.remove_host(&id)? {
        return Err(ApiError::not_found("host", &id));
    }
    st.hosts.write().remove(&id);
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
