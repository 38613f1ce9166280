//! What an NF declares about a table, and the checks on it.

use crate::error::StateError;

/// Whose entries a table holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Scope {
    /// One entry per flow; keys are flow indices of the current batch.
    PerFlow,
    /// Entries keyed by the NF's own keys.
    Global,
}

/// Who may write a table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Access {
    /// Written only during `init`; every worker holds a replica.
    ReadOnly,
    /// Written by `process` as well.
    ReadWrite,
}

/// What the values are.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Kind {
    /// `u64` counters keyed by `u64`.
    Counter,
    /// Byte values keyed by bytes.
    Bytes,
}

/// How the replicas of an eventual table combine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Merge {
    /// Values add up.
    Sum,
    /// The largest wins.
    Max,
    /// The smallest wins.
    Min,
}

impl Merge {
    /// Combines two values.
    pub fn apply(self, a: u64, b: u64) -> u64 {
        match self {
            Merge::Sum => a.saturating_add(b),
            Merge::Max => a.max(b),
            Merge::Min => a.min(b),
        }
    }
}

/// How workers share a global read-write table.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum Consistency {
    /// Not shared (per-flow and read-only tables).
    Local,
    /// Per-worker replicas merged periodically.
    Eventual {
        /// How replicas combine.
        merge: Merge,
        /// Merge period in ns of packet time (0: every batch).
        merge_interval_ns: u64,
    },
    /// A pool of integer resources split between workers.
    Release {
        /// First resource.
        first: u64,
        /// Number of resources.
        count: u64,
        /// Resources a worker takes at a time (0: host's choice).
        chunk: u32,
    },
    /// Every key has one owner worker, its only writer; other workers'
    /// writes are forwarded to it ([`crate::single`]).
    SingleWriter {
        /// How often owners apply forwarded writes and publish, in ns of
        /// packet time (0: every batch).
        sync_interval_ns: u64,
    },
}

/// A table as declared.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TableSpec {
    /// Unique name within the NF.
    pub name: String,
    /// Per-flow or global.
    pub scope: Scope,
    /// Read-only or read-write.
    pub access: Access,
    /// Counters or bytes.
    pub kind: Kind,
    /// Sharing between workers.
    pub consistency: Consistency,
    /// Exact key length of a global byte table (0: 1..=256).
    pub key_size: u32,
    /// Longest value of a byte table.
    pub max_value_size: u32,
    /// Most entries per worker; eventual and single-writer tables: of the
    /// whole table (0: [`DEFAULT_CAPACITY`]).
    pub capacity: u32,
    /// Idle expiry in ns of packet time (0: never).
    pub idle_timeout_ns: u64,
    /// Whether expired entries are handed to the NF.
    pub notify_expired: bool,
}

/// Entries per table when the spec says 0.
pub const DEFAULT_CAPACITY: u32 = 65_536;
/// Longest key of a byte table.
pub const MAX_KEY_SIZE: u32 = 256;
/// Longest value of a byte table.
pub const MAX_VALUE_SIZE: u32 = 65_536;
/// Largest pool (16,777,216 resources, as the contract documents).
pub const MAX_POOL: u64 = 1 << 24;
/// Most tables per NF.
pub const MAX_TABLES: usize = 64;

impl TableSpec {
    /// Entries per worker this table may hold.
    pub fn capacity(&self) -> usize {
        if self.capacity == 0 { DEFAULT_CAPACITY as usize } else { self.capacity as usize }
    }

    /// Checks the spec on its own.
    pub fn validate(&self) -> Result<(), StateError> {
        let bad = |m: String| Err(StateError::BadSpec(format!("table '{}': {m}", self.name)));
        let name_ok = !self.name.is_empty()
            && self.name.len() <= 64
            && self.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-_.".contains(&b));
        if !name_ok {
            return Err(StateError::BadSpec(format!(
                "table name '{}' must be 1-64 characters of a-z, 0-9, '-', '_', '.'",
                self.name
            )));
        }
        match (self.scope, self.access, self.consistency) {
            (Scope::PerFlow, _, Consistency::Local) => {}
            (Scope::PerFlow, _, _) => {
                return bad("a per-flow table has one owner: its consistency must be local".into());
            }
            (Scope::Global, Access::ReadOnly, Consistency::Local) => {}
            (Scope::Global, Access::ReadOnly, _) => {
                return bad("a read-only table is replicated: its consistency must be local".into());
            }
            (Scope::Global, Access::ReadWrite, Consistency::Local) => {
                return bad(
                    "a global read-write table is shared by workers: choose single-writer, eventual or release consistency"
                        .into(),
                );
            }
            (Scope::Global, Access::ReadWrite, Consistency::SingleWriter { .. }) => {}
            (Scope::Global, Access::ReadWrite, Consistency::Eventual { merge, .. }) => {
                if self.kind != Kind::Counter {
                    return bad("eventual consistency needs a counter table (merge combines u64 values)".into());
                }
                let _ = merge;
            }
            (Scope::Global, Access::ReadWrite, Consistency::Release { first, count, .. }) => {
                if self.kind != Kind::Bytes {
                    return bad("a release table binds byte values to resources: its kind must be bytes".into());
                }
                if count == 0 || count > MAX_POOL {
                    return bad(format!("pool count {count} is out of range 1..={MAX_POOL}"));
                }
                if first.checked_add(count).is_none() {
                    return bad(format!("pool {first} + {count} overflows u64"));
                }
                if self.idle_timeout_ns != 0 || self.notify_expired {
                    return bad("release tables do not expire: free resources with `release`".into());
                }
                if self.capacity != 0 && u64::from(self.capacity) < count {
                    return bad(format!(
                        "a release table holds up to its {count} resources: leave capacity 0 (or at least {count}), or declare a smaller pool"
                    ));
                }
            }
        }
        if self.kind == Kind::Bytes {
            if self.key_size > MAX_KEY_SIZE {
                return bad(format!("key-size {} exceeds {MAX_KEY_SIZE}", self.key_size));
            }
            if self.max_value_size == 0 || self.max_value_size > MAX_VALUE_SIZE {
                return bad(format!("max-value-size {} is out of range 1..={MAX_VALUE_SIZE}", self.max_value_size));
            }
        }
        Ok(())
    }

    /// Why `next` cannot take over this table's contents, if it cannot.
    pub fn incompatibility(&self, next: &TableSpec) -> Option<String> {
        let what = if self.scope != next.scope {
            format!("scope {:?} -> {:?}", self.scope, next.scope)
        } else if self.access != next.access {
            format!("access {:?} -> {:?}", self.access, next.access)
        } else if self.kind != next.kind {
            format!("kind {:?} -> {:?}", self.kind, next.kind)
        } else if !same_consistency(self.consistency, next.consistency) {
            format!("consistency {:?} -> {:?}", self.consistency, next.consistency)
        } else if self.kind == Kind::Bytes && self.key_size != next.key_size {
            format!("key-size {} -> {}", self.key_size, next.key_size)
        } else {
            return None;
        };
        Some(format!(
            "table '{}' was declared with another layout ({what}); keep the declaration or use a new table name",
            self.name
        ))
    }
}

/// Consistency modes that can share contents: the same mode and merge, and
/// for pools the same resources (the chunk, merge period and sync interval
/// may change).
fn same_consistency(a: Consistency, b: Consistency) -> bool {
    match (a, b) {
        (Consistency::Local, Consistency::Local) => true,
        (Consistency::Eventual { merge: m1, .. }, Consistency::Eventual { merge: m2, .. }) => m1 == m2,
        (Consistency::Release { first: f1, count: c1, .. }, Consistency::Release { first: f2, count: c2, .. }) => {
            f1 == f2 && c1 == c2
        }
        (Consistency::SingleWriter { .. }, Consistency::SingleWriter { .. }) => true,
        _ => false,
    }
}
