//! Names: the one rule for what a tenant, module, NF, deployment, host
//! group, host or cluster may be called, and for a module version.
//!
//! A name is also a token of NATS subjects and bucket keys (which split on
//! `.` and treat `*` and `>` as wildcards) and a file name, so it is 1-64
//! ASCII letters, digits, `-` or `_`, starting with a letter or digit.

/// A name or version that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NameError {
    /// Not a name.
    #[error(
        "{what} '{value}' is not a valid name: use 1-64 letters, digits, '-' or '_', starting with a letter or digit"
    )]
    Name {
        /// What it names (`tenant`, `host`, `cluster`, ...).
        what: String,
        /// The refused value.
        value: String,
    },
    /// Not a version.
    #[error("version '{0}' is not valid: use 1-64 letters, digits, '.', '_', '+' or '-' (e.g. 1.2.0)")]
    Version(String),
}

/// The longest name or version.
pub const MAX_NAME_LEN: usize = 64;

/// [`check_name`]'s rule as a regular expression (what the gateway's
/// OpenAPI document gives every name).
pub const NAME_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$";

/// Checks `value`, the name of a `what`.
pub fn check_name(what: &str, value: &str) -> Result<(), NameError> {
    let ok = (1..=MAX_NAME_LEN).contains(&value.len())
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
        && value.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric());
    if ok { Ok(()) } else { Err(NameError::Name { what: what.to_string(), value: value.to_string() }) }
}

/// Checks a module version: 1-64 letters, digits, `.`, `_`, `+` or `-`.
pub fn check_version(value: &str) -> Result<(), NameError> {
    let ok = (1..=MAX_NAME_LEN).contains(&value.len())
        && value.bytes().all(|b| b.is_ascii_alphanumeric() || b"._+-".contains(&b));
    if ok { Ok(()) } else { Err(NameError::Version(value.to_string())) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_subject_tokens_and_file_names() {
        for good in ["a", "fw-1", "edge_2", "0day", &"x".repeat(64)] {
            assert!(check_name("host", good).is_ok(), "{good}");
        }
        for bad in ["", "-a", "_a", "a.b", "a*", "a>", "a b", "ü", &"x".repeat(65)] {
            assert!(check_name("host", bad).is_err(), "{bad}");
        }
        for good in ["1.2.0", "0.1.0-rc.1+build_7"] {
            assert!(check_version(good).is_ok(), "{good}");
        }
        for bad in ["", "1 2", "1/2", &"1".repeat(65)] {
            assert!(check_version(bad).is_err(), "{bad}");
        }
    }
}
