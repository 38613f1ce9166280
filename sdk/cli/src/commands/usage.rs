//! `sluice usage` and `sluice bill`: what the tenant's NFs used, and the
//! bill of a month.

use super::context::Context;
use crate::args::Output;
use crate::print::{emit, out, print_bill, print_usage};
use anyhow::Result;
use sluice_cli::client::{Answer, encode};
use sluice_gateway::api::{BillOut, UsageOut};

/// Prints usage by deployment, NF and version from `from` to `to` (JSON
/// with `json` or `--output json`).
pub fn usage(cx: &Context, from: Option<String>, to: Option<String>, json: bool) -> Result<()> {
    let mut q = Vec::new();
    if let Some(f) = from {
        q.push(format!("from={}", encode(&f)));
    }
    if let Some(t) = to {
        q.push(format!("to={}", encode(&t)));
    }
    let u: Answer<UsageOut> = cx.tenant().get(&format!("/v1/usage?{}", q.join("&")))?;
    if json || cx.output == Output::Json {
        emit(&u)
    } else {
        print_usage(&u.model);
        Ok(())
    }
}

/// Prints the bill of `period` (`YYYY-MM`): a table, the gateway's CSV
/// with `csv`, or JSON with `json` or `--output json`.
pub fn bill(cx: &Context, period: &str, csv: bool, json: bool) -> Result<()> {
    let path = format!("/v1/bill?period={}&format={}", encode(period), if csv { "csv" } else { "json" });
    if csv {
        out!("{}", cx.tenant().get_text(&path)?);
        return Ok(());
    }
    let b: Answer<BillOut> = cx.tenant().get(&path)?;
    if json || cx.output == Output::Json {
        emit(&b)
    } else {
        print_bill(&b.model);
        Ok(())
    }
}
