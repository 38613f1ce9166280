//! What commands print on stdout: [`outln!`] and [`out!`] (quiet when the
//! reader went away), JSON for `--output json` ([`emit`]), and
//! the tables people read of the gateway's answers (deployments, API
//! keys, groups, log lines, usage, bills), from the API's typed models.

use crate::args::Output;
use anyhow::Result;
use serde::Serialize;
use sluice_cli::client::{Answer, bar, human};
use sluice_gateway::api::{BillOut, DeploymentOut, KeyOut, LogsOut, UsageOut, UsageRow};
use sluice_gateway::groups::{GroupOut, GroupSettings};

/// `println!` for what the command prints on stdout: when the reader went
/// away (`sluice … | head`) the command ends quietly, never with a panic.
macro_rules! outln {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = writeln!(std::io::stdout(), $($t)*) {
            $crate::print::stdout_failed(e)
        }
    }};
}

/// `print!` as [`outln!`] does it.
macro_rules! out {
    ($($t:tt)*) => {{
        use std::io::Write as _;
        if let Err(e) = write!(std::io::stdout(), $($t)*) {
            $crate::print::stdout_failed(e)
        }
    }};
}

pub(crate) use {out, outln};

/// Ends the command after a failed write to stdout: quietly (status 0) when
/// the reader closed the pipe, else with the error.
pub fn stdout_failed(e: std::io::Error) -> ! {
    if e.kind() == std::io::ErrorKind::BrokenPipe {
        std::process::exit(0);
    }
    eprintln!("error: writing to stdout: {e}");
    std::process::exit(1)
}

/// Prints `v` as JSON (`--output json`).
pub fn emit(v: &impl Serialize) -> Result<()> {
    outln!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

/// The name the API gives an enum's value (`"standby"`, `"dispatcher"`).
pub fn api_name(v: &impl Serialize) -> String {
    match serde_json::to_value(v) {
        Ok(serde_json::Value::String(s)) => s,
        Ok(other) => other.to_string(),
        Err(_) => String::new(),
    }
}

/// Time as RFC 3339 from ms since the epoch (empty when out of range).
fn rfc3339_ms(ms: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(ms / 1000)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_default()
}

/// A tenant's API keys (`sluice tenant keys`, `sluice key list`).
pub fn print_keys<'a>(keys: impl IntoIterator<Item = &'a KeyOut>) {
    outln!("{:<10} {:<26} CURRENT", "PREFIX", "CREATED");
    for k in keys {
        outln!("{:<10} {:<26} {}", k.prefix, rfc3339_ms(k.created_ms), if k.current { "*" } else { "" });
    }
}

/// A deployment: its chain and status, then its traffic and each host.
pub fn print_deployment(d: &DeploymentOut) {
    let nfs: Vec<String> = d.nfs.iter().map(|n| format!("{}={}@{}", n.name, n.module_name, n.version)).collect();
    outln!(
        "{} ({}) rev {} group {}: {}{}  [{}]",
        d.name,
        d.id,
        d.revision,
        d.group,
        d.status,
        d.reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default(),
        nfs.join(" -> ")
    );
    if !d.attachments.is_empty() {
        outln!("  traffic {}", d.attachments.join("; "));
    }
    for h in &d.hosts {
        outln!(
            "  host {:<16} {:<8} rev {} {:>10} packets{}",
            h.host,
            h.state,
            h.revision,
            h.packets,
            h.reason.as_ref().map(|r| format!("  {r}")).unwrap_or_default()
        );
    }
}

/// Usage by deployment, NF and version, with its total and a bar of
/// each row's packets.
pub fn print_usage(u: &UsageOut) {
    if u.rows.is_empty() {
        outln!("no usage in this range");
        return;
    }
    let max = u.rows.iter().map(|r| r.meters.packets as f64).fold(0.0, f64::max);
    outln!(
        "{:<14} {:<12} {:<10} {:>12} {:>12} {:>12} {:>10} {:>10} {:>8} {:>14} {:>10} {:>10} {:>10} {:>10} {:>6}  packets",
        "deployment",
        "nf",
        "version",
        "invocations",
        "packets",
        "forwarded",
        "dropped",
        "rewritten",
        "policy",
        "bytes",
        "cpu ms",
        "state ops",
        "state GB-h",
        "state now",
        "traps"
    );
    let line = |r: &UsageRow, deployment: &str, nf: &str, version: &str| {
        format!(
            "{:<14} {:<12} {:<10} {:>12} {:>12} {:>12} {:>10} {:>10} {:>8} {:>14} {:>10.3} {:>10} {:>10.4} {:>10} {:>6}",
            deployment,
            nf,
            version,
            r.meters.invocations,
            r.meters.packets,
            r.meters.forwarded,
            r.meters.dropped,
            r.meters.rewritten,
            r.meters.policy,
            r.meters.bytes,
            r.meters.cpu_ns as f64 / 1e6,
            r.meters.all_state_ops(),
            r.state_gb_hours,
            format!("{}B", human(r.state_bytes as f64)),
            r.meters.traps,
        )
    };
    for r in &u.rows {
        let l = line(r, &r.deployment_name, &r.nf, &r.version);
        outln!("{l}  {}", bar(r.meters.packets as f64, max, 24));
    }
    outln!("{}", line(&u.total, "total", "", ""));
}

/// A bill: each priced item with a bar of its share, the total, and what
/// it bills.
pub fn print_bill(b: &BillOut) {
    outln!("bill for {} ({}), {}", b.tenant_name, b.tenant, b.period);
    outln!(
        "{:<12} {:>14} {:>12} {:>14} {:>10} {:>10}  {:<20} share of the bill",
        "item",
        "used",
        "included",
        "billable",
        "price",
        "amount",
        "unit"
    );
    let top = b.lines.iter().map(|l| l.amount_minor as f64).fold(0.0, f64::max);
    for l in &b.lines {
        outln!(
            "{:<12} {:>14.6} {:>12.6} {:>14.6} {:>10} {:>10}  {:<20} {}",
            l.item,
            l.quantity,
            l.included,
            l.billable,
            l.unit_price,
            l.amount,
            l.unit,
            bar(l.amount_minor as f64, top, 20)
        );
    }
    outln!("{:<12} {:>74} {}", "total", b.total, b.currency);
    let packets: f64 = b.usage.iter().map(|r| r.meters.packets as f64).sum();
    outln!("({} packets billed across {} NF version(s))", human(packets), b.usage.len());
}

/// A group's scaling settings in one line.
pub fn settings_line(s: &GroupSettings) -> String {
    let max = s.max_hosts.map_or("no limit".to_string(), |m| m.to_string());
    let target = s.target_load.map_or("off (every host active)".to_string(), |t| format!("{t}"));
    format!("min-hosts {}, max-hosts {max}, target-load {target}", s.min_hosts)
}

/// A group: its table, load and settings, then each member.
pub fn print_group(g: &GroupOut) {
    outln!(
        "group {}  table v{}  active {}/proposed {}  demand {} pps  load {} pps  capacity {} pps  ({})",
        g.group,
        g.table_version,
        g.active_hosts,
        g.proposed_hosts,
        g.demand_pps,
        g.load_pps,
        g.capacity_pps,
        settings_line(&g.settings)
    );
    outln!(
        "  {:<20} {:<9} {:>12} {:>12} {:>7} {:>9} {:>6}",
        "HOST",
        "STATE",
        "CAPACITY",
        "LOAD",
        "SHARE",
        "SEEN(ms)",
        "TABLE"
    );
    for m in &g.members {
        outln!(
            "  {:<20} {:<9} {:>12} {:>12} {:>6.1}% {:>9} {:>6}",
            m.host,
            api_name(&m.state),
            m.capacity_pps,
            m.load_pps,
            m.share * 100.0,
            m.last_seen_ms_ago.map_or("-".to_string(), |v| v.to_string()),
            m.table_version.map_or("-".to_string(), |v| format!("v{v}")),
        );
    }
}

/// Prints the lines of a `GET /v1/logs` page: each as it came, one object
/// a line, with `--output json`; else one line each for people. A closed
/// pipe ends the command quietly.
pub fn print_log_lines(page: &Answer<LogsOut>, output: Output) -> Result<()> {
    let texts: Vec<String> = match output {
        Output::Json => page
            .json
            .get("lines")
            .and_then(serde_json::Value::as_array)
            .into_iter()
            .flatten()
            .map(serde_json::Value::to_string)
            .collect(),
        Output::Table => page
            .model
            .lines
            .iter()
            .map(|l| {
                let what = if l.kind == "trap" {
                    let extra: Vec<String> = l.fields.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    format!("TRAP ({}): {} {}", l.cause.as_deref().unwrap_or_default(), l.message, extra.join(" "))
                } else {
                    format!("[{}] {}", l.source.as_deref().unwrap_or_default(), l.message)
                };
                let deployment = if l.deployment_name.is_empty() { &l.deployment } else { &l.deployment_name };
                format!("{} {:<5} {}/{}@{} {}  {}", l.time, l.level, deployment, l.nf, l.version, l.host, what)
            })
            .collect(),
    };
    for text in texts {
        print_line(&text)?;
    }
    Ok(())
}

/// Writes one line to stdout; a closed pipe ends the command quietly.
fn print_line(text: &str) -> Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(0),
        r => Ok(r?),
    }
}
