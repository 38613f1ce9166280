//! `sluice groups`: host groups, their members and ownership tables;
//! scaling settings, added capacity and drains (as the operator, with the
//! admin token).

use super::context::Context;
use crate::args::GroupsCommand;
use crate::print::{emit, outln, print_group, settings_line};
use anyhow::Result;
use serde_json::{Value, json};
use sluice_cli::client::{Answer, encode};
use sluice_gateway::groups::{GroupOut, GroupSettings};

/// Runs a `sluice groups` subcommand (`list` without one).
pub fn run(cx: &Context, command: Option<GroupsCommand>) -> Result<()> {
    let admin = cx.admin();
    match command.unwrap_or(GroupsCommand::List) {
        GroupsCommand::List => {
            let gs: Vec<Answer<GroupOut>> = admin.get("/v1/groups")?;
            if cx.json() {
                return emit(&gs);
            }
            if gs.is_empty() {
                outln!("no groups yet: register hosts with `sluice host add`");
            }
            for g in &gs {
                print_group(&g.model);
            }
        }
        GroupsCommand::Show { group } => {
            let g: Answer<GroupOut> = admin.get(&format!("/v1/groups/{}", encode(&group)))?;
            if cx.json() {
                return emit(&g);
            }
            print_group(&g.model);
        }
        GroupsCommand::Set { group, min_hosts, max_hosts, no_max, target_load, no_target } => {
            let mut body = serde_json::Map::new();
            if let Some(m) = min_hosts {
                body.insert("min_hosts".into(), json!(m));
            }
            if no_max {
                body.insert("max_hosts".into(), Value::Null);
            } else if let Some(m) = max_hosts {
                body.insert("max_hosts".into(), json!(m));
            }
            if no_target {
                body.insert("target_load".into(), Value::Null);
            } else if let Some(t) = target_load {
                body.insert("target_load".into(), json!(t));
            }
            let s: Answer<GroupSettings> =
                admin.put(&format!("/v1/groups/{}/settings", encode(&group)), &Value::Object(body))?;
            if cx.json() {
                return emit(&s);
            }
            outln!("group {group}: {}", settings_line(&s.model));
        }
        GroupsCommand::AddCapacity { group, hosts } => {
            let s: Answer<GroupSettings> =
                admin.post(&format!("/v1/groups/{}/capacity", encode(&group)), &json!({ "hosts": hosts }))?;
            if cx.json() {
                return emit(&s);
            }
            outln!("group {group}: {}", settings_line(&s.model));
        }
        GroupsCommand::Drain { group, host, undo } => {
            let path = format!("/v1/groups/{}/hosts/{}/drain", encode(&group), encode(&host));
            if undo {
                admin.delete(&path)?;
                outln!("host {host} of group {group} may own flows again");
            } else {
                admin.post_empty(&path)?;
                outln!("host {host} of group {group} is draining: the next table gives its flows to their next owners");
            }
        }
    }
    Ok(())
}
