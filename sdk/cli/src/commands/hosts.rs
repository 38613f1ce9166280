//! `sluice host`: registering, listing and removing the cluster's hosts
//! (as the operator, with the admin token).

use super::context::Context;
use crate::args::HostCommand;
use crate::print::{emit, outln};
use anyhow::Result;
use serde_json::json;
use sluice_cli::client::{Answer, encode};
use sluice_gateway::api::HostOut;

/// Runs a `sluice host` subcommand.
pub fn run(cx: &Context, command: HostCommand) -> Result<()> {
    let admin = cx.admin();
    match command {
        HostCommand::Add { id, group, nkey, dispatcher, max_pps, max_bps } => {
            let role = if dispatcher { "dispatcher" } else { "host" };
            let h: Answer<HostOut> = admin.post(
                "/v1/hosts",
                &json!({ "id": id, "group": group, "nkey": nkey, "role": role, "max_pps": max_pps, "max_bps": max_bps }),
            )?;
            if cx.json() {
                return emit(&h);
            }
            outln!("{role} {} registered in group {}", h.model.host, h.model.group);
        }
        HostCommand::List => {
            let hs: Vec<Answer<HostOut>> = admin.get_all("/v1/hosts")?;
            if cx.json() {
                return emit(&hs);
            }
            outln!("{:<20} {:<16} {:<6} {:>11}", "HOST", "GROUP", "ALIVE", "DEPLOYMENTS");
            for h in hs.iter().map(|h| &h.model) {
                // The count is written unpadded, right after the ALIVE column.
                outln!("{:<20} {:<16} {:<6} {}", h.host, h.group, if h.alive { "yes" } else { "no" }, h.deployments);
            }
        }
        HostCommand::Remove { id } => {
            admin.delete(&format!("/v1/hosts/{}", encode(&id)))?;
            if cx.json() {
                return emit(&json!({ "removed": id }));
            }
            outln!("host {id} removed");
        }
    }
    Ok(())
}
