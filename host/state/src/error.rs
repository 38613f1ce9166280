//! Errors of state operations: handed to the NF as values, never traps.

/// Why a state operation failed (mirrors `sluice:nf/state.state-error`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StateError {
    /// No table with this handle.
    #[error("no table with handle {0}")]
    UnknownTable(u32),
    /// `declare` outside `init`, or a write to a read-only table outside it.
    #[error("not allowed outside init")]
    NotNow,
    /// The operation does not fit the table's kind.
    #[error("operation does not fit the table's kind")]
    WrongKind,
    /// Invalid spec.
    #[error("bad table spec: {0}")]
    BadSpec(String),
    /// Existing table with another layout.
    #[error("{0}")]
    Incompatible(String),
    /// Malformed input at this item.
    #[error("malformed input at item {0}")]
    BadInput(u32),
    /// Capacity reached at this item.
    #[error("table full at item {0}")]
    Full(u32),
    /// Memory budget used up at this item.
    #[error("state memory budget used up at item {0}")]
    OverBudget(u32),
    /// Value too long at this item.
    #[error("value too large at item {0}")]
    TooLarge(u32),
}
