//! A tenant's NF logs: the lines its NFs wrote and their traps.

use super::{parse_time, rfc3339_ns, time_param};
use crate::auth::Tenant;
use crate::error::{ApiError, ApiQuery, ErrorBody};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

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
