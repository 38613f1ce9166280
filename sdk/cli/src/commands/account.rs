//! The calling tenant's own account: its API keys (`sluice key`) and a
//! one-time link into the dashboard (`sluice dashboard`).

use super::context::Context;
use crate::args::KeyCommand;
use crate::print::{emit, outln, print_keys};
use anyhow::Result;
use serde_json::json;
use sluice_cli::client::{Answer, encode};
use sluice_gateway::api::{DashboardLink, KeyCreated, KeyOut};

/// Runs a `sluice key` subcommand.
pub fn key(cx: &Context, command: KeyCommand) -> Result<()> {
    let tenant = cx.tenant();
    match command {
        KeyCommand::List => {
            let keys: Vec<Answer<KeyOut>> = tenant.get("/v1/me/keys")?;
            if cx.json() {
                return emit(&keys);
            }
            print_keys(keys.iter().map(|k| &k.model));
        }
        KeyCommand::Add => {
            let k: Answer<KeyCreated> = tenant.post("/v1/me/keys", &json!({}))?;
            if cx.json() {
                return emit(&k);
            }
            outln!("{}", k.model.api_key);
        }
        KeyCommand::Rotate => {
            let k: Answer<KeyCreated> = tenant.post("/v1/me/keys/rotate", &json!({}))?;
            if cx.json() {
                return emit(&k);
            }
            let key = &k.model.api_key;
            outln!("new API key (shown once; the old one no longer works): {key}");
            outln!("  export SLUICE_API_KEY={key}");
        }
        KeyCommand::Revoke { prefix } => {
            tenant.delete(&format!("/v1/me/keys/{}", encode(&prefix)))?;
            if cx.json() {
                return emit(&json!({ "revoked": prefix }));
            }
            outln!("revoked {prefix}");
        }
    }
    Ok(())
}

/// `sluice dashboard`: a link that signs into the dashboard once.
pub fn dashboard(cx: &Context) -> Result<()> {
    let link: DashboardLink = cx.tenant().post("/v1/me/dashboard-link", &json!({}))?;
    let url = format!("{}{}", cx.url.trim_end_matches('/'), link.path);
    if cx.json() {
        return emit(&json!({ "url": url, "expires_in_s": link.expires_in_s }));
    }
    outln!("{url}");
    eprintln!("open it within {} s; it signs in once", link.expires_in_s);
    Ok(())
}
