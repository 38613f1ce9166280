//! `sluice sdk`: where the SDK is, and installing its copy for projects.

use super::context::Context;
use crate::print::{emit, outln};
use anyhow::Result;
use serde_json::json;
use std::path::PathBuf;

/// `sluice sdk path`: the SDK found and the copy projects reference.
pub fn path(cx: &Context) -> Result<()> {
    let sdk = cx.sdk()?;
    let copy = sdk.projects_copy()?;
    if cx.json() {
        return emit(&json!({ "sdk": sdk.root(), "projects_copy": copy }));
    }
    outln!("sdk: {}", sdk.root().display());
    outln!("projects' copy: {}", copy.display());
    Ok(())
}

/// `sluice sdk install`: the projects' copy, or a standalone one in `to`
/// (an empty or missing directory).
pub fn install(cx: &Context, to: Option<PathBuf>) -> Result<()> {
    let sdk = cx.sdk()?;
    let installed = match to {
        Some(dir) => {
            if std::fs::read_dir(&dir).is_ok_and(|mut d| d.next().is_some()) {
                anyhow::bail!("{} is not empty; give an empty or missing directory", dir.display());
            }
            sdk.install(&dir)?
        }
        None => sdk.for_projects()?,
    };
    if cx.json() {
        return emit(&json!({ "installed": installed.root() }));
    }
    outln!("installed {}", installed.root().display());
    Ok(())
}
