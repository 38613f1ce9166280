//! Deployments: a module or a chain onto a host group, with its limits and
//! traffic attachments; their status per host, updates (compare-and-set
//! on the revision) and deletion. The request and its checks are in
//! [`request`].

mod request;

#[cfg(test)]
pub(crate) use request::limits_spec;
pub use request::{
    AttachmentIn, AttachmentObject, DeploymentIn, LimitsIn, MAX_ATTACHMENTS, MAX_CONFIG_BYTES, MAX_DEPLOYMENT_BYTES,
    NfIn,
};
pub(crate) use request::{check_group_attachments, check_reverse, parse_attachments};

use super::{PageParams, check_name, created_key, now, page, quota};
use crate::auth::Tenant;
use crate::error::{ApiError, ApiPath, ApiQuery, ErrorBody};
use crate::secrets::random_hex;
use crate::state::{AppState, stored_nfs};
use crate::store::DeploymentRow;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use request::resolve;
use serde::{Deserialize, Serialize};
use sluice_control::{HostState, subjects::check_token};
use sluice_traffic::Attachment;
use std::collections::BTreeMap;
use utoipa::ToSchema;

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
    /// What a host's death may lose of its flows' state: `periodic` or
    /// `replicated`.
    #[schema(value_type = String, example = "periodic")]
    pub durability: sluice_control::Durability,
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

/// A deployment as the API shows it: its chain, and its status on each
/// live host of its group.
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
        durability: row.durability,
        status: status.into(),
        reason,
        hosts,
        created_ms: row.created_ms,
        updated_ms: row.updated_ms,
    }
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

/// Publishes `groups`; a transient failure is retried every second.
/// Answers the error if `deployment` itself cannot be published (the
/// deployment is then `failed` with it).
async fn publish(st: &AppState, groups: &[&str], deployment: Option<&str>) -> Result<(), ApiError> {
    for g in groups {
        if let Err(e) = st.publish_group(g).await {
            // Stored; retried every second until the bus takes it.
            st.unpublished.lock().insert(g.to_string());
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
        durability: req.durability.unwrap_or_default(),
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
    let durability = req.durability.unwrap_or(row.durability);
    if spec == row.spec
        && group == row.group
        && attachments == row.attachments
        && fragments == row.fragments
        && durability == row.durability
    {
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
        durability,
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
    st.publish_errors.lock().remove(&row.id);
    publish(&st, &[&row.group], None).await?;
    Ok(StatusCode::NO_CONTENT)
}
