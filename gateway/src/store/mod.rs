//! The gateway's metadata in SQLite: tenants, API keys (hashed), modules,
//! deployments and meter records.
//!
//! Meter records are keyed by their id, and inserted with `INSERT OR
//! IGNORE`: a record delivered twice is stored once. That, and acking a
//! record only after its insert committed, is what makes billing exact
//! under redelivery. WAL mode lets readers (reports) run beside the writer.
//!
//! The schema is versioned: `gateway/migrations/V<n>__<what>.sql`, applied
//! in order at open by refinery (which records them in
//! `refinery_schema_history`).
//!
//! This file opens the database; the queries are in one file per
//! resource: [`tenants`] (and API keys), [`hosts`], [`groups`],
//! [`modules`], [`deployments`], [`meters`] (and usage), [`events`] (and
//! NF logs). Their row types are re-exported here.

mod deployments;
mod events;
mod groups;
mod hosts;
mod meters;
mod modules;
mod tenants;
#[cfg(test)]
mod tests;

pub use deployments::DeploymentRow;
pub use events::{LogQuery, LogRow};
pub use hosts::{HostCeiling, HostRow};
pub use meters::{SeriesPoint, UsageSums};
pub use modules::ModuleRow;
pub use tenants::TenantRow;

use parking_lot::Mutex;
use rusqlite::Connection;
use std::path::Path;

/// Storage errors.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// SQLite failed.
    #[error("database: {0}")]
    Sql(#[from] rusqlite::Error),
    /// The schema could not be brought up to date.
    #[error("migrating database {path}: {reason}")]
    Migration {
        /// Database file.
        path: String,
        /// Cause.
        reason: String,
    },
    /// A row changed (or was created) by another request in the meantime.
    #[error("{0}")]
    Conflict(String),
    /// A deployment's traffic attachment overlaps one of another
    /// deployment of its host group (the message says whose, naming the
    /// other deployment only to its own tenant).
    #[error("{0}")]
    Overlap(String),
    /// A stored document could not be decoded.
    #[error("database holds a malformed {what}: {reason}")]
    Corrupt {
        /// What.
        what: &'static str,
        /// Cause.
        reason: String,
    },
}

mod embedded {
    refinery::embed_migrations!("migrations");
}

/// The SQLite database.
#[derive(Debug)]
pub struct Store {
    conn: Mutex<Connection>,
}

/// A stored count as unsigned (negative: 0).
fn u(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}
/// A count as SQLite stores it (saturating).
fn i(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Store {
    /// Opens (creating) the database at `path`.
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        let conn = Connection::open(path)?;
        conn.pragma_update(None, "journal_mode", "WAL")?;
        conn.pragma_update(None, "synchronous", "FULL")?;
        conn.pragma_update(None, "foreign_keys", "ON")?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mut conn = conn;
        embedded::migrations::runner()
            .run(&mut conn)
            .map_err(|e| StoreError::Migration { path: path.display().to_string(), reason: e.to_string() })?;
        Ok(Store { conn: Mutex::new(conn) })
    }

    fn db(&self) -> parking_lot::MutexGuard<'_, Connection> {
        self.conn.lock()
    }

    /// Whether the database takes writes now: a write transaction is
    /// begun and rolled back (for `/readyz`).
    pub fn check_writable(&self) -> Result<(), StoreError> {
        self.db().execute_batch("BEGIN IMMEDIATE; ROLLBACK;")?;
        Ok(())
    }
}
