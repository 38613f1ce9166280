//! `sluice dev`: a gateway and one pcap-fed host in this process, and
//! optionally a project watched as the tenant `dev`.

use super::context::Context;
use super::watch::watch_as_dev_tenant;
use crate::args::DevArgs;
use crate::print::outln;
use anyhow::Result;
use sluice_cli::Project;

/// Runs the dev cluster until Ctrl-C or SIGTERM, saying first where its
/// gateway, dashboard, spool directory and admin token are.
pub fn dev(cx: &Context, args: DevArgs) -> Result<()> {
    let DevArgs { listen, data, spool, window_ms, config, metrics_listen, watch: watched } = args;
    let output = cx.output;
    let telemetry = sluice_telemetry::start(sluice_telemetry::Settings {
        service: if metrics_listen.is_some() { "sluice-dev" } else { "" },
        log_default: "warn",
        prometheus: metrics_listen.is_some(),
        ..Default::default()
    })?;
    // The project is checked before anything starts.
    let watched = match watched {
        Some(dir) => Some((cx.projects_sdk()?, Project::open(&dir)?)),
        None => None,
    };
    let data = match data {
        Some(d) => d,
        None => sluice_cli::dev::default_data_dir()?,
    };
    let token_file = data.join("admin-token");
    let default_data = sluice_cli::dev::default_data_dir().is_ok_and(|d| d == data);
    let given_token = cx.admin_token.is_some();
    let opts = sluice_cli::dev::DevOptions {
        listen,
        data_dir: data,
        spool,
        admin_token: cx.admin_token.clone(),
        window: std::time::Duration::from_millis(window_ms.max(10)),
        config,
        metrics_listen,
        prometheus: telemetry.prometheus(),
    };
    let rt = tokio::runtime::Runtime::new()?;
    // The signal handlers are installed inside the runtime.
    let _in_runtime = rt.enter();
    rt.block_on(sluice_cli::dev::run(
        opts,
        |url, token, spool| {
            outln!("sluice dev: gateway {url} (dashboard {url}/dashboard, API docs {url}/docs)");
            outln!("sluice dev: one host in group 'default'; drop captures into {}", spool.display());
            if given_token {
                outln!("sluice dev: admin token as given (--admin-token or SLUICE_ADMIN_TOKEN)");
            } else if default_data {
                outln!(
                    "sluice dev: admin token in {} (sluice commands on this machine read it there)",
                    token_file.display()
                );
            } else {
                outln!("sluice dev: admin token in {}", token_file.display());
            }
            // The CLI's default gateway is 127.0.0.1:8080; another
            // address needs saying to the commands of other shells.
            if url.trim_end_matches('/') != "http://127.0.0.1:8080" {
                outln!("export SLUICE_URL={url}");
            }
            if let Some((sdk, project)) = watched {
                let (url, token) = (url.to_string(), token.to_string());
                std::thread::spawn(move || {
                    if let Err(e) = watch_as_dev_tenant(&url, &token, &sdk, &project, output) {
                        eprintln!("sluice dev: watching {} stopped: {e:#}", project.dir.display());
                    }
                });
            }
        },
        sluice_control::shutdown_signal(),
    ))?;
    telemetry.shutdown();
    Ok(())
}
