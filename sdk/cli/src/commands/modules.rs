//! Modules on the gateway: `sluice nf upload`, `nf list` and `nf delete`,
//! and the upload `sluice nf deploy` makes once per version.

use super::context::Context;
use crate::print::{emit, outln};
use anyhow::{Context as _, Result};
use serde_json::json;
use sluice_cli::client::{Answer, Client, ClientError, encode};
use sluice_gateway::api::ModuleOut;
use std::path::Path;

/// The path a module is uploaded to as `name@version`.
pub fn upload_path(name: &str, version: &str) -> String {
    format!("/v1/modules?name={}&version={}", encode(name), encode(version))
}

/// `sluice nf upload`: a component as `name@version` (`name` defaults to
/// the file's stem).
pub fn upload(cx: &Context, file: &Path, name: Option<String>, version: &str) -> Result<()> {
    let name = name.or_else(|| file.file_stem().and_then(|s| s.to_str()).map(str::to_string)).context("give --name")?;
    let bytes = std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
    let m: Answer<ModuleOut> = cx.tenant().post_bytes(&upload_path(&name, version), "application/wasm", &bytes)?;
    if cx.json() {
        return emit(&m);
    }
    let m = &m.model;
    outln!(
        "uploaded {}@{}: id {}, {} bytes, sluice:nf@{}, sha256 {}",
        m.name,
        m.version,
        m.id,
        m.size,
        m.contract,
        m.digest
    );
    Ok(())
}

/// `sluice nf list`: the tenant's modules.
pub fn list(cx: &Context) -> Result<()> {
    let ms: Vec<Answer<ModuleOut>> = cx.tenant().get_all("/v1/modules")?;
    if cx.json() {
        return emit(&ms);
    }
    outln!("{:<16} {:<20} {:<10} {:>10}  {:<14} deployed in", "id", "name", "version", "bytes", "digest");
    for m in ms.iter().map(|m| &m.model) {
        outln!(
            "{:<16} {:<20} {:<10} {:>10}  {:<14} {}",
            m.id,
            m.name,
            m.version,
            m.size,
            short_digest(&m.digest),
            m.deployed_in.join(",")
        );
    }
    Ok(())
}

/// `sluice nf delete`: a module no deployment uses.
pub fn delete(cx: &Context, module: &str) -> Result<()> {
    cx.tenant().delete(&format!("/v1/modules/{}", encode(module)))?;
    if cx.json() {
        return emit(&json!({ "deleted": module }));
    }
    outln!("deleted {module}");
    Ok(())
}

/// The first 12 hex digits of a digest, as listings show it.
pub fn short_digest(digest: &str) -> String {
    digest.chars().take(12).collect()
}

/// Uploads `bytes` as `name@version`, or finds it there already with the
/// same bytes; the module, and whether it was uploaded now. The same
/// version with other bytes is an error: a gateway keeps each version's
/// bytes for good.
pub fn upload_once(client: &Client, name: &str, version: &str, bytes: &[u8]) -> Result<(ModuleOut, bool)> {
    use sha2::Digest;
    let digest = hex::encode(sha2::Sha256::digest(bytes));
    let id = format!("{name}@{version}");
    match client.get::<ModuleOut>(&format!("/v1/modules/{}", encode(&id))) {
        Ok(m) if m.digest == digest => return Ok((m, false)),
        Ok(_) => anyhow::bail!(
            "{id} is on the gateway already with other bytes: module versions are immutable; raise `version` in sluice.toml"
        ),
        Err(ClientError::Api { status: 404, .. }) => {}
        Err(e) => return Err(e.into()),
    }
    Ok((client.post_bytes(&upload_path(name, version), "application/wasm", bytes)?, true))
}
