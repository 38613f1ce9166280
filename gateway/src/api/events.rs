//! The events a tenant's NFs emitted, newest first, paged.

use super::{parse_time, rfc3339_ns, time_param};
use crate::auth::Tenant;
use crate::error::{ApiError, ApiQuery, ErrorBody};
use crate::state::AppState;
use axum::Json;
use axum::extract::State;
use axum::http::header;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

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
