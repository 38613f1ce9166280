//! `sluice tenant`: tenants, their API keys and the host groups they may
//! deploy to (as the operator, with the admin token).

use super::context::Context;
use crate::args::TenantCommand;
use crate::print::{emit, outln, print_keys};
use anyhow::Result;
use serde_json::json;
use sluice_cli::client::{Answer, encode};
use sluice_gateway::api::{Grants, KeyCreated, KeyOut, TenantCreated, TenantOut};

/// Runs a `sluice tenant` subcommand.
pub fn run(cx: &Context, command: TenantCommand) -> Result<()> {
    let admin = cx.admin();
    match command {
        TenantCommand::Create { name, groups, key_only } => {
            let mut body = serde_json::Map::new();
            body.insert("name".into(), json!(name));
            if let Some(g) = groups {
                body.insert("groups".into(), json!(g));
            }
            let t: Answer<TenantCreated> = admin.post("/v1/tenants", &serde_json::Value::Object(body))?;
            let key = &t.model.api_key;
            if cx.json() {
                emit(&t)?;
            } else if key_only {
                outln!("{key}");
            } else {
                outln!("tenant {} ({})", t.model.name, t.model.id);
                outln!("API key (shown once): {key}");
                outln!("  export SLUICE_API_KEY={key}");
            }
        }
        TenantCommand::List => {
            let ts: Vec<Answer<TenantOut>> = admin.get_all("/v1/tenants")?;
            if cx.json() {
                return emit(&ts);
            }
            for t in ts.iter().map(|t| &t.model) {
                outln!("{:<16} {}", t.id, t.name);
            }
        }
        TenantCommand::Key { tenant } => {
            let k: Answer<KeyCreated> = admin.post(&format!("/v1/tenants/{}/keys", encode(&tenant)), &json!({}))?;
            if cx.json() {
                return emit(&k);
            }
            outln!("{}", k.model.api_key);
        }
        TenantCommand::Keys { tenant } => {
            let keys: Vec<Answer<KeyOut>> = admin.get(&format!("/v1/tenants/{}/keys", encode(&tenant)))?;
            if cx.json() {
                return emit(&keys);
            }
            print_keys(keys.iter().map(|k| &k.model));
        }
        TenantCommand::Revoke { tenant, prefix } => {
            admin.delete(&format!("/v1/tenants/{}/keys/{}", encode(&tenant), encode(&prefix)))?;
            if cx.json() {
                return emit(&json!({ "revoked": prefix }));
            }
            outln!("revoked {prefix}");
        }
        TenantCommand::Grant { tenant, groups } => {
            let g: Answer<Grants> =
                admin.put(&format!("/v1/tenants/{}/groups", encode(&tenant)), &json!({ "groups": groups }))?;
            if cx.json() {
                return emit(&g);
            }
            outln!("{tenant} may deploy to: {}", serde_json::to_string(&g.model.groups)?);
        }
    }
    Ok(())
}
