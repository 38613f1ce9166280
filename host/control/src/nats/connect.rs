//! Connecting to NATS: credentials, TLS and the nkey seed file.

use super::*;
use crate::auth::NatsAuth;

/// Builds the connect options of `auth` (credentials, TLS).
pub(super) async fn connect_options(
    url: &str,
    auth: &NatsAuth,
    inbox: String,
    who: &str,
) -> Result<async_nats::ConnectOptions, BusError> {
    let conn = |reason: String| BusError::Connect { url: url.to_string(), reason };
    let mut opts = match (&auth.creds_file, &auth.nkey_file) {
        (Some(_), Some(_)) => return Err(conn("give either an nkey seed file or a creds file, not both".into())),
        (Some(creds), None) => async_nats::ConnectOptions::with_credentials_file(creds.clone())
            .await
            .map_err(|e| conn(format!("reading credentials {}: {e}", creds.display())))?,
        (None, Some(path)) => {
            let seed = read_seed(path).map_err(conn)?;
            async_nats::ConnectOptions::with_nkey(seed)
        }
        (None, None) => async_nats::ConnectOptions::new(),
    };
    if let Some(ca) = &auth.ca_file {
        if !ca.is_file() {
            return Err(conn(format!("CA file {} does not exist", ca.display())));
        }
        opts = opts.add_root_certificates(ca.clone()).require_tls(true);
    }
    match (&auth.cert_file, &auth.key_file) {
        (Some(cert), Some(key)) => {
            for f in [cert, key] {
                if !f.is_file() {
                    return Err(conn(format!("TLS file {} does not exist", f.display())));
                }
            }
            opts = opts.add_client_certificate(cert.clone(), key.clone()).require_tls(true);
        }
        (None, None) => {}
        _ => return Err(conn("a client certificate needs both the certificate and its key".into())),
    }
    Ok(opts.name(who).custom_inbox_prefix(inbox).connection_timeout(Duration::from_secs(5)).retry_on_initial_connect())
}

/// Reads an nkey seed file (the first line starting with `SU`, so a file
/// with comments works), refusing one others can read.
pub fn read_seed(path: &std::path::Path) -> Result<String, String> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let meta = std::fs::metadata(path).map_err(|e| format!("nkey seed {}: {e}", path.display()))?;
    let mode = meta.permissions().mode();
    // Its owner's alone, or (as PostgreSQL allows for its key) owned by
    // root and readable by its group: how Kubernetes mounts a Secret for a
    // process that does not run as root (root:fsGroup, 0440).
    let root_shares_with_group = meta.uid() == 0 && mode & 0o037 == 0;
    if mode & 0o077 != 0 && !root_shares_with_group {
        return Err(format!(
            "nkey seed {} is readable by other users; chmod 600 it (or 640 if root owns it)",
            path.display()
        ));
    }
    let text = std::fs::read_to_string(path).map_err(|e| format!("nkey seed {}: {e}", path.display()))?;
    text.lines()
        .map(str::trim)
        .find(|l| l.starts_with("SU"))
        .map(str::to_string)
        .ok_or_else(|| format!("{} holds no nkey user seed (a line starting with SU)", path.display()))
}
