//! Usage and bills: a tenant's metered usage over a range, as rows and as
//! a time series, and the bill of a month priced by the gateway's plan.

use super::{parse_time, time_param};
use crate::auth::Tenant;
use crate::billing::{self, BillLine};
use crate::error::{ApiError, ApiQuery, ErrorBody};
use crate::state::AppState;
use crate::store::UsageSums;
use axum::Json;
use axum::extract::State;
use axum::http::{HeaderMap, header};
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use sluice_control::Meters;
use std::collections::BTreeMap;
use utoipa::{IntoParams, ToSchema};

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
    /// What was metered (inlined): every meter counter summed over the
    /// range (`packets`, `forwarded`, `dropped`, `policy`, `rewritten`,
    /// `bytes`, `cpu_ns`, `state_ops` (per-flow state), `table_ops`,
    /// `traps` and `trap_causes`, `state_byte_ms`, ...; see the
    /// `Meters` schema), and as gauges the state held at the end of the
    /// latest meter window in the range (`table_bytes`,
    /// `flow_state_bytes`): each host's latest record of the deployment's
    /// NF, counted in the row of the module version that host ran then,
    /// summed over hosts; 0 in rows of versions no host ran last. In
    /// `total`: the sum of the rows. `state_byte_ms` saturates at 2^64 - 1
    /// (about 5,124 GB-hours); `state_gb_hours` does not.
    #[serde(flatten)]
    pub meters: Meters,
    /// State held times the time it was held, in GB-hours (10^9 bytes for
    /// an hour), as billed.
    #[serde(default)]
    pub state_gb_hours: f64,
    /// State held at the end of the latest meter window in the range,
    /// bytes: `table_bytes + flow_state_bytes`.
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
        state_gb_hours: billing::gb_hours(u.state_byte_ms),
        state_bytes: u.sums.state_bytes(),
        meters: u.sums,
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
