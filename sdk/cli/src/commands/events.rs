//! `sluice events`: the newest events the tenant's NFs emitted.

use super::context::Context;
use crate::print::{emit, outln};
use anyhow::Result;
use sluice_cli::client::{Answer, encode};
use sluice_gateway::api::EventOut;

/// Prints the newest `limit` events, of one deployment, kind, or since a
/// time when given.
pub fn events(
    cx: &Context,
    deployment: Option<String>,
    kind: Option<String>,
    since: Option<String>,
    limit: u64,
) -> Result<()> {
    let mut q = vec![format!("limit={limit}")];
    for (k, v) in [("deployment", deployment), ("kind", kind), ("since", since)] {
        if let Some(v) = v {
            q.push(format!("{k}={}", encode(&v)));
        }
    }
    let evs: Vec<Answer<EventOut>> = cx.tenant().get(&format!("/v1/events?{}", q.join("&")))?;
    if cx.json() {
        return emit(&evs);
    }
    if evs.is_empty() {
        outln!("no events");
    }
    for e in evs.iter().map(|e| &e.model) {
        let fields: Vec<String> = e
            .fields
            .iter()
            .filter(|(k, v)| !(k.as_str() == "flow" && e.flow.as_ref() == Some(*v)))
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let deployment = if e.deployment_name.is_empty() { &e.deployment } else { &e.deployment_name };
        // Wall clock first; the packet's own time is in --output json.
        outln!(
            "{} {:<6} {:<16} {deployment}/{}@{} {}  {}  {}",
            e.time,
            e.level,
            e.kind,
            e.nf,
            e.version,
            e.flow.as_deref().unwrap_or("-"),
            fields.join(" "),
            e.host
        );
    }
    Ok(())
}
