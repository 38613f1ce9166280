//! `sluice logs`: what the tenant's NFs wrote and their traps, once or
//! followed.

use super::context::Context;
use crate::args::Output;
use crate::print::print_log_lines;
use anyhow::Result;
use sluice_cli::client::{Answer, encode};
use sluice_gateway::api::LogsOut;

/// Prints the newest `limit` log lines of `level` or above (of one
/// deployment, NF, or since a time when given), then, with `follow`, new
/// ones as they come.
pub fn logs(
    cx: &Context,
    deployment: Option<String>,
    nf: Option<String>,
    level: &str,
    since: Option<String>,
    limit: u64,
    follow: bool,
) -> Result<()> {
    let client = cx.tenant();
    let limit = limit.clamp(1, 1000);
    let mut q = vec![format!("level={}", encode(level)), format!("limit={limit}")];
    for (k, v) in [("deployment", deployment), ("nf", nf), ("since", since)] {
        if let Some(v) = v {
            q.push(format!("{k}={}", encode(&v)));
        }
    }
    let mut after: Option<String> = None;
    loop {
        let mut query = q.clone();
        if let Some(a) = &after {
            query.push(format!("after={}", encode(a)));
        }
        let page: Answer<LogsOut> = client.get(&format!("/v1/logs?{}", query.join("&")))?;
        print_log_lines(&page, cx.output)?;
        let lines = page.model.lines.len();
        if let Some(n) = page.model.next {
            after = Some(n);
        }
        if !follow {
            if lines == 0 && after.is_none() && cx.output == Output::Table {
                eprintln!("no log lines");
            }
            break;
        }
        // Following: a full page means more are waiting.
        if (lines as u64) < limit {
            std::thread::sleep(std::time::Duration::from_secs(1));
        }
    }
    Ok(())
}
