//! What every command may need of the command line's global flags: the
//! gateway and its credentials, the SDK, and how to print.

use crate::args::Output;
use anyhow::Result;
use sluice_cli::Sdk;
use sluice_cli::client::Client;
use std::path::PathBuf;

/// The global flags, once the command is taken out of the command line.
pub struct Context {
    /// `--sdk-root`.
    pub sdk_root: Option<PathBuf>,
    /// `--url`: the gateway.
    pub url: String,
    /// `--api-key`: the tenant's key.
    pub api_key: Option<String>,
    /// `--admin-token`.
    pub admin_token: Option<String>,
    /// `--output`.
    pub output: Output,
}

impl Context {
    /// Whether the command prints JSON (`--output json`).
    pub fn json(&self) -> bool {
        self.output == Output::Json
    }

    /// A client of the gateway as the tenant whose API key was given.
    pub fn tenant(&self) -> Client {
        Client::new(&self.url, self.api_key.clone())
    }

    /// A client of the gateway as its operator: the admin token given, or
    /// the one of a `sluice dev` on this machine.
    pub fn admin(&self) -> Client {
        Client::new(&self.url, self.admin_token.clone().or_else(|| dev_admin_token(&self.url)))
    }

    /// The SDK (`--sdk-root`, else found next to this binary).
    pub fn sdk(&self) -> Result<Sdk> {
        Ok(Sdk::locate(self.sdk_root.as_deref())?)
    }

    /// The SDK's installed copy that projects build against.
    pub fn projects_sdk(&self) -> Result<Sdk> {
        Ok(self.sdk()?.for_projects()?)
    }
}

/// The admin token of a `sluice dev` on this machine in its default data
/// directory, when `url` is a loopback address and the file is there.
fn dev_admin_token(url: &str) -> Option<String> {
    let host = url.split("://").nth(1)?.split(['/', ':']).next()?;
    if !matches!(host, "127.0.0.1" | "localhost" | "[") {
        return None;
    }
    let file = sluice_cli::dev::default_data_dir().ok()?.join("admin-token");
    std::fs::read_to_string(file).ok().map(|t| t.trim().to_string()).filter(|t| !t.is_empty())
}
