//! Deployments: `sluice deploy`, `deployments`, `undeploy` and `sluice nf
//! deploy`, and the deployment request of a project that `nf watch` sends
//! too.

use super::context::Context;
use super::modules::{short_digest, upload_once};
use super::nf::build_project;
use crate::args::DeployArgs;
use crate::print::{emit, outln, print_deployment};
use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use sluice_cli::Project;
use sluice_cli::client::{Answer, Client, ClientError, encode};
use sluice_gateway::api::DeploymentOut;
use std::path::{Path, PathBuf};

/// A deployment as the gateway answered.
pub type Deployment = Answer<DeploymentOut>;

/// `sluice deploy`: creates or updates a deployment from `--module`s or a
/// `--spec`, then waits for its hosts.
pub fn deploy(cx: &Context, args: DeployArgs) -> Result<()> {
    let DeployArgs { name, modules, config_files, spec, group, attach, fragments, durability, limits, wait } = args;
    let limits = limits.to_json();
    if spec.is_some() && !limits.is_empty() {
        anyhow::bail!("with --spec, give the limits per NF in the spec (\"limits\": {{...}})");
    }
    // Attachments are checked here first, so a typo fails before
    // anything is sent.
    let attach = attach
        .iter()
        .map(|a| a.parse::<sluice_traffic::Attachment>().map(|a| Value::String(a.to_string())))
        .collect::<Result<Vec<Value>, _>>()
        .context("--attach")?;
    let client = cx.tenant();
    let mut body: Value = match spec {
        Some(p) => serde_json::from_slice(&std::fs::read(&p).with_context(|| format!("reading {}", p.display()))?)
            .with_context(|| format!("{} is not JSON", p.display()))?,
        None => {
            if modules.is_empty() {
                anyhow::bail!("give --module <name@version> (repeat for a chain) or --spec <file.json>");
            }
            if !config_files.is_empty() && config_files.len() != modules.len() {
                anyhow::bail!(
                    "give one --config-file per --module ({} modules, {} config files)",
                    modules.len(),
                    config_files.len()
                );
            }
            let mut nfs = Vec::new();
            for (i, m) in modules.iter().enumerate() {
                let config = match config_files.get(i) {
                    Some(f) => {
                        Value::String(std::fs::read_to_string(f).with_context(|| format!("reading {}", f.display()))?)
                    }
                    None => Value::Null,
                };
                nfs.push(json!({ "module": m, "config": config, "limits": Value::Object(limits.clone()) }));
            }
            json!({ "nfs": nfs })
        }
    };
    let Some(obj) = body.as_object_mut() else {
        anyhow::bail!("the deployment spec must be a JSON object (see {}/docs)", cx.url);
    };
    obj.insert("name".into(), Value::String(name.clone()));
    obj.entry("group").or_insert(Value::String(group));
    if !attach.is_empty() {
        obj.insert("attach".into(), Value::Array(attach));
    }
    if let Some(d) = durability {
        obj.insert("durability".into(), Value::String(d.to_string()));
    }
    if let Some(f) = fragments {
        obj.insert("fragments".into(), Value::String(f.to_string()));
    }
    let d = put_deployment(&client, &name, &body)?;
    finish_deploy(cx, &client, &name, d, wait)
}

/// `sluice deployments`: every deployment with its status per host.
pub fn list(cx: &Context) -> Result<()> {
    let ds: Vec<Deployment> = cx.tenant().get_all("/v1/deployments")?;
    if cx.json() {
        return emit(&ds);
    }
    if ds.is_empty() {
        outln!("no deployments");
    }
    for d in &ds {
        print_deployment(&d.model);
    }
    Ok(())
}

/// `sluice undeploy`: deletes a deployment.
pub fn undeploy(cx: &Context, name: &str) -> Result<()> {
    cx.tenant().delete(&format!("/v1/deployments/{}", encode(name)))?;
    if cx.json() {
        return emit(&json!({ "deleted": name }));
    }
    outln!("deleted deployment {name}");
    Ok(())
}

/// `sluice nf deploy`: builds the project, uploads its version once, and
/// creates or updates its deployment as sluice.toml says.
pub fn nf_deploy(cx: &Context, project: &Path, wait: u64, cargo_target_dir: Option<PathBuf>) -> Result<()> {
    let sdk = cx.projects_sdk()?;
    let project = Project::open(project)?;
    let client = cx.tenant();
    client.check_key()?;
    let m = &project.manifest;
    let built = build_project(&project, &sdk, cargo_target_dir)?;
    let bytes = std::fs::read(&built.path).with_context(|| format!("reading {}", built.path.display()))?;
    let (module, uploaded) = upload_once(&client, &m.name, &m.version, &bytes)?;
    eprintln!(
        "{} {}@{} ({} bytes, sha256 {})",
        if uploaded { "uploaded" } else { "already on the gateway:" },
        m.name,
        m.version,
        module.size,
        short_digest(&module.digest)
    );
    let body = Value::Object(deployment_body(&project, &m.version, None)?);
    let name = project.deployment_name().to_string();
    let d = put_deployment(&client, &name, &body)?;
    finish_deploy(cx, &client, &name, d, wait)
}

/// Creates deployment `name` from `body`, or updates it if it exists;
/// the gateway's answer.
pub fn put_deployment(client: &Client, name: &str, body: &Value) -> Result<Deployment> {
    let path = format!("/v1/deployments/{}", encode(name));
    Ok(match client.get::<DeploymentOut>(&path) {
        Ok(_) => client.put(&path, body)?,
        Err(ClientError::Api { status: 404, .. }) => client.post("/v1/deployments", body)?,
        Err(e) => return Err(e.into()),
    })
}

/// Deployment `name` once it runs or failed, or after `wait` seconds
/// (starting from `d`, the gateway's last answer).
pub fn wait_deployment(client: &Client, name: &str, d: Deployment, wait: u64) -> Result<Deployment> {
    let path = format!("/v1/deployments/{}", encode(name));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(wait);
    let mut last = d;
    while wait > 0 && std::time::Instant::now() < deadline {
        last = client.get(&path)?;
        match last.model.status.as_str() {
            "running" | "failed" => break,
            _ => std::thread::sleep(std::time::Duration::from_millis(200)),
        }
    }
    Ok(last)
}

/// The deployment request of a project's sluice.toml running
/// `<name>@<version>`: its deployment name, group, attachments, and the
/// NF's configuration (`config` instead of the manifest's when given) and
/// limits under the API's names.
pub fn deployment_body(
    project: &Project,
    version: &str,
    config: Option<Vec<u8>>,
) -> Result<serde_json::Map<String, Value>> {
    let m = &project.manifest;
    let config = match config {
        Some(c) => c,
        None => project.config_bytes()?,
    };
    let config = String::from_utf8(config)
        .map_err(|_| anyhow::anyhow!("the NF's configuration is not UTF-8 text, which a deployment carries"))?;
    let mut body = serde_json::Map::new();
    body.insert("name".into(), json!(project.deployment_name()));
    body.insert("group".into(), json!(m.deployment.group.clone().unwrap_or_else(|| "default".into())));
    body.insert(
        "nfs".into(),
        json!([{
            "name": m.name,
            "module": format!("{}@{version}", m.name),
            "config": config,
            "limits": Value::Object(project.limits().limits_json()),
        }]),
    );
    if !m.deployment.attach.is_empty() {
        body.insert("attach".into(), json!(m.deployment.attach));
    }
    if let Some(d) = m.deployment.durability {
        body.insert("durability".into(), json!(d.to_string()));
    }
    if let Some(f) = m.deployment.fragments {
        body.insert("fragments".into(), json!(f.to_string()));
    }
    Ok(body)
}

/// Reports a created or updated deployment, waits up to `wait` seconds
/// for its hosts, and fails if it failed or is not running by then.
fn finish_deploy(cx: &Context, client: &Client, name: &str, d: Deployment, wait: u64) -> Result<()> {
    // Progress on stderr when stdout carries JSON.
    let said = format!(
        "deployment {} ({}) revision {} on group {}",
        d.model.name, d.model.id, d.model.revision, d.model.group
    );
    if cx.json() {
        eprintln!("{said}");
    } else {
        outln!("{said}");
    }
    let last = wait_deployment(client, name, d, wait)?;
    if cx.json() {
        emit(&last)?;
    } else {
        print_deployment(&last.model);
    }
    let last = &last.model;
    if last.status == "failed" {
        anyhow::bail!("deployment {name} failed: {}", last.reason.as_deref().unwrap_or("see the hosts above"));
    }
    if wait > 0 && last.status != "running" {
        anyhow::bail!(
            "deployment {name} is {} after {wait} s (--wait): not every host of its group runs it yet",
            last.status
        );
    }
    Ok(())
}
