//! `sluice nf watch` and `sluice dev --watch`: rebuild, upload and
//! hot-swap a project's deployment on every save, printing its NF's log
//! lines and traps meanwhile.

use super::context::Context;
use super::deployments::{deployment_body, put_deployment, wait_deployment};
use super::modules::upload_path;
use crate::args::{Output, WatchArgs};
use crate::print::{outln, print_log_lines};
use anyhow::{Context as _, Result};
use parking_lot::Mutex;
use serde_json::{Value, json};
use sluice_cli::client::{Answer, Client, ClientError, encode};
use sluice_cli::{BuildOptions, Project, Sdk};
use sluice_gateway::api::{KeyCreated, LogsOut, ModuleOut, TenantCreated, TenantOut};
use std::path::Path;
use std::sync::Arc;

/// `sluice nf watch`: watches the project as the tenant until Ctrl-C,
/// then says what it leaves deployed.
pub fn nf_watch(cx: &Context, project: &Path, args: WatchArgs) -> Result<()> {
    let sdk = cx.projects_sdk()?;
    let project = Project::open(project)?;
    let client = cx.tenant();
    client.check_key()?;
    let deployment = args.deployment.clone().unwrap_or_else(|| project.deployment_name().to_string());
    let running = Arc::new(Mutex::new(None));
    say_where_watch_left(deployment, running.clone());
    watch(&client, &sdk, &project, args, cx.output, &running)
}

/// `sluice dev --watch`: the tenant `dev` (created if missing) gets a new
/// API key, printed, and watches `project` with it.
pub fn watch_as_dev_tenant(url: &str, admin_token: &str, sdk: &Sdk, project: &Project, output: Output) -> Result<()> {
    let admin = Client::new(url, Some(admin_token.to_string()));
    let created: Result<TenantCreated, _> = admin.post("/v1/tenants", &json!({ "name": "dev" }));
    let key = match created {
        Ok(t) => t.api_key,
        Err(ClientError::Api { status: 409, .. }) => {
            let tenants: Vec<TenantOut> = admin.get_all("/v1/tenants")?;
            let id = tenants
                .iter()
                .find(|t| t.name == "dev")
                .map(|t| t.id.as_str())
                .context("the tenant 'dev' exists but is not listed")?;
            let k: KeyCreated = admin.post(&format!("/v1/tenants/{}/keys", encode(id)), &json!({}))?;
            k.api_key
        }
        Err(e) => return Err(e.into()),
    };
    outln!("sluice dev: watching {} as tenant dev; its API key:", project.dir.display());
    outln!("export SLUICE_API_KEY={key}");
    let args = WatchArgs { deployment: None, group: None, config_file: None, interval_ms: 500, cargo_target_dir: None };
    watch(&Client::new(url, Some(key)), sdk, project, args, output, &Default::default())
}

/// `sluice nf watch`: on every save, build, upload under a new dev
/// version, and swap the deployment to it; meanwhile the NF's log lines
/// and traps. Runs until interrupted.
/// `running` holds `name@version` of what the deployment runs since the
/// last swap.
fn watch(
    client: &Client,
    sdk: &Sdk,
    project: &Project,
    w: WatchArgs,
    output: Output,
    running: &Mutex<Option<String>>,
) -> Result<()> {
    let nf = project.manifest.name.clone();
    let deployment = w.deployment.clone().unwrap_or_else(|| project.deployment_name().to_string());
    let config = match &w.config_file {
        Some(f) => Some(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?),
        None => None,
    };
    let mut seen: Option<String> = None;
    let mut previous: Option<String> = None;
    let mut after: Option<String> = None;
    let mut generation = 0u64;
    let started = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    eprintln!("watching {} (deployment {deployment}); Ctrl-C stops", project.dir.display());
    loop {
        let fp = project.sources_digest()?;
        if seen.as_deref() != Some(fp.as_str()) {
            seen = Some(fp);
            generation += 1;
            eprintln!("building {nf} ...");
            match sluice_cli::build(project, sdk, &BuildOptions::with_code_cache(w.cargo_target_dir.clone())) {
                Err(e) => eprintln!("build failed; fix it and save again:\n{e}"),
                Ok(built) => {
                    let version = format!("0.0.0-dev.{started}.{generation}");
                    let bytes =
                        std::fs::read(&built.path).with_context(|| format!("reading {}", built.path.display()))?;
                    let uploaded: Result<ModuleOut, _> =
                        client.post_bytes(&upload_path(&nf, &version), "application/wasm", &bytes);
                    match uploaded {
                        Err(e) => eprintln!("upload of {nf}@{version} refused: {e}"),
                        Ok(_) => {
                            let mut body = deployment_body(project, &version, config.clone())?;
                            body.insert("name".into(), json!(deployment));
                            if let Some(g) = &w.group {
                                body.insert("group".into(), json!(g));
                            }
                            let d = put_deployment(client, &deployment, &Value::Object(body))
                                .and_then(|d| wait_deployment(client, &deployment, d, 30));
                            match d.map(|d| d.model) {
                                Ok(d) if d.status == "running" => {
                                    eprintln!("deployment {deployment} revision {} runs {nf}@{version}", d.revision);
                                    *running.lock() = Some(format!("{nf}@{version}"));
                                    // The dev version it replaced is no longer deployed.
                                    if let Some(old) = previous.replace(format!("{nf}@{version}")) {
                                        let _ = client.delete(&format!("/v1/modules/{}", encode(&old)));
                                    }
                                }
                                Ok(d) => eprintln!(
                                    "deployment {deployment} is {}: {}",
                                    d.status,
                                    d.reason.as_deref().unwrap_or("not every host runs it yet")
                                ),
                                Err(e) => eprintln!("deploying {nf}@{version}: {e:#}"),
                            }
                        }
                    }
                }
            }
        }
        // The NF's log lines and traps since the last look.
        let mut q = vec![format!("deployment={}", encode(&deployment)), "limit=200".to_string()];
        if let Some(a) = &after {
            q.push(format!("after={}", encode(a)));
        }
        if let Ok(page) = client.get::<Answer<LogsOut>>(&format!("/v1/logs?{}", q.join("&"))) {
            print_log_lines(&page, output)?;
            if let Some(n) = page.model.next {
                after = Some(n);
            }
        }
        std::thread::sleep(std::time::Duration::from_millis(w.interval_ms));
    }
}

/// On Ctrl-C or SIGTERM, says what `sluice nf watch` leaves deployed and
/// how to put the manifest's version back, then ends the process.
fn say_where_watch_left(deployment: String, running: Arc<Mutex<Option<String>>>) {
    std::thread::spawn(move || {
        let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else { return };
        rt.block_on(async { sluice_control::shutdown_signal().await });
        match running.lock().clone() {
            Some(v) => eprintln!(
                "\nstopped watching; deployment {deployment} stays on {v}. `sluice nf deploy` puts sluice.toml's version back; `sluice undeploy {deployment}` removes it"
            ),
            None => eprintln!("\nstopped watching; no version of this watch was deployed"),
        }
        std::process::exit(130);
    });
}
