//! Host groups over HTTP (admin): what the group controller sees of each
//! group, its scaling settings, added capacity, and draining hosts (see
//! [`crate::groups`] for the controller itself).

use crate::auth::Admin;
use crate::error::{ApiError, ApiPath, ErrorBody};
use crate::groups::{GroupOut, MemberState};
use crate::model::GroupSettings;
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use serde::Deserialize;
use sluice_control::subjects::check_token;
use sluice_group::MAX_MEMBERS;
use utoipa::ToSchema;

/// Host groups: members, capacity, load, demand and the ownership table
/// version (admin).
#[utoipa::path(get, path = "/v1/groups", tag = "groups", security(("bearer" = [])),
    responses((status = 200, body = [GroupOut]), (status = 403, body = ErrorBody)))]
pub async fn list_groups(State(st): State<AppState>, _: Admin) -> Json<Vec<GroupOut>> {
    Json(st.groups.list())
}

/// One host group (admin).
#[utoipa::path(get, path = "/v1/groups/{group}", tag = "groups", security(("bearer" = [])),
    params(("group" = String, Path, description = "Group name", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")),
    responses((status = 200, body = GroupOut), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn get_group(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(group): ApiPath<String>,
) -> Result<Json<GroupOut>, ApiError> {
    st.groups
        .list()
        .into_iter()
        .find(|g| g.group == group)
        .map(Json)
        .ok_or_else(|| ApiError::not_found("group", &group))
}

/// Changes to a group's scaling settings: fields left out keep their value;
/// `null` clears `max_hosts` or `target_load`.
#[derive(Debug, Default, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SettingsIn {
    /// Fewest active hosts (1-254).
    #[serde(default, deserialize_with = "crate::whole::optional")]
    #[schema(minimum = 1, maximum = 254)]
    pub min_hosts: Option<u32>,
    /// Most active hosts, at least `min_hosts` (null: no limit).
    #[serde(default, deserialize_with = "crate::whole::nullable")]
    #[schema(value_type = Option<u32>, minimum = 1, maximum = 254)]
    pub max_hosts: Option<Option<u32>>,
    /// Load to run active hosts at, 0.05-1 (null: every host active).
    #[serde(default, with = "double_option")]
    #[schema(value_type = Option<f64>, minimum = 0.05, maximum = 1)]
    pub target_load: Option<Option<f64>>,
}

mod double_option {
    use serde::{Deserialize, Deserializer};
    pub fn deserialize<'de, T: Deserialize<'de>, D: Deserializer<'de>>(d: D) -> Result<Option<Option<T>>, D::Error> {
        Option::<T>::deserialize(d).map(Some)
    }
}

/// Set a group's scaling settings (admin): `min_hosts`, `max_hosts`,
/// `target_load`. Applied at the controller's next tick.
#[utoipa::path(put, path = "/v1/groups/{group}/settings", tag = "groups", security(("bearer" = [])),
    params(("group" = String, Path, description = "Group name", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")), request_body = SettingsIn,
    responses((status = 200, body = GroupSettings), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody)))]
pub async fn set_settings(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(group): ApiPath<String>,
    body: Result<Json<SettingsIn>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<GroupSettings>, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    check_token("group", &group).map_err(|e| ApiError::bad_request(e.to_string()))?;
    let mut s = st.store.group_settings()?.get(&group).copied().unwrap_or_default();
    if let Some(m) = req.min_hosts {
        s.min_hosts = m;
    }
    if let Some(m) = req.max_hosts {
        s.max_hosts = m;
    }
    if let Some(t) = req.target_load {
        s.target_load = t;
    }
    s.check().map_err(|e| ApiError::bad_request(format!("group {group}: {e}")))?;
    st.store.set_group_settings(&group, &s)?;
    tracing::info!(group, ?s, "group settings changed");
    Ok(Json(s))
}

/// Capacity to add.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CapacityIn {
    /// Hosts to add to the group's active ones (1-254).
    #[serde(deserialize_with = "crate::whole::required")]
    #[schema(minimum = 1, maximum = 254)]
    pub hosts: u32,
}

/// Add capacity to a group (admin): raises `min_hosts` to the active
/// hosts plus `hosts`, so that many standby hosts become active at the
/// next tick (and the autoscaler does not take them back below it).
#[utoipa::path(post, path = "/v1/groups/{group}/capacity", tag = "groups", security(("bearer" = [])),
    params(("group" = String, Path, description = "Group name", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")), request_body = CapacityIn,
    responses((status = 200, body = GroupSettings), (status = 400, body = ErrorBody), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn add_capacity(
    State(st): State<AppState>,
    _: Admin,
    ApiPath(group): ApiPath<String>,
    body: Result<Json<CapacityIn>, axum::extract::rejection::JsonRejection>,
) -> Result<Json<GroupSettings>, ApiError> {
    let Json(req) = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let g =
        st.groups.list().into_iter().find(|g| g.group == group).ok_or_else(|| ApiError::not_found("group", &group))?;
    if !(1..=MAX_MEMBERS as u32).contains(&req.hosts) {
        return Err(ApiError::bad_request(format!("hosts {} must be 1 to {MAX_MEMBERS}", req.hosts)));
    }
    let mut s = g.settings;
    let active = u32::try_from(g.active_hosts).unwrap_or(u32::MAX);
    s.min_hosts = active.saturating_add(req.hosts).min(MAX_MEMBERS as u32);
    if s.max_hosts.is_some_and(|m| m < s.min_hosts) {
        s.max_hosts = Some(s.min_hosts);
    }
    s.check().map_err(|e| ApiError::bad_request(format!("group {group}: {e}")))?;
    st.store.set_group_settings(&group, &s)?;
    let standby = g.members.iter().filter(|m| m.state == MemberState::Standby).count();
    tracing::info!(group, min_hosts = s.min_hosts, standby, "capacity added");
    Ok(Json(s))
}

/// Drain a host (admin): it keeps running and stays registered, but the
/// next table gives its flows to their next owners and it owns none until
/// undrained.
#[utoipa::path(post, path = "/v1/groups/{group}/hosts/{host}/drain", tag = "groups", security(("bearer" = [])),
    params(("group" = String, Path, description = "Group name", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"), ("host" = String, Path, description = "Host id", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn drain(
    State(st): State<AppState>,
    _: Admin,
    ApiPath((group, host)): ApiPath<(String, String)>,
) -> Result<axum::http::StatusCode, ApiError> {
    mark(&st, &group, &host, true)
}

/// Undrain a host (admin): it may own flows again.
#[utoipa::path(delete, path = "/v1/groups/{group}/hosts/{host}/drain", tag = "groups", security(("bearer" = [])),
    params(("group" = String, Path, description = "Group name", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"), ("host" = String, Path, description = "Host id", pattern = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody)))]
pub async fn undrain(
    State(st): State<AppState>,
    _: Admin,
    ApiPath((group, host)): ApiPath<(String, String)>,
) -> Result<axum::http::StatusCode, ApiError> {
    mark(&st, &group, &host, false)
}

fn mark(st: &AppState, group: &str, host: &str, drained: bool) -> Result<axum::http::StatusCode, ApiError> {
    if st.store.host_group(host)?.as_deref() != Some(group) {
        return Err(ApiError::not_found("host", &format!("{group}/{host}")));
    }
    st.store.set_drained(host, drained)?;
    tracing::info!(group, host, drained, "host drain mark changed");
    Ok(axum::http::StatusCode::NO_CONTENT)
}
