//! How every Sluice binary reads its configuration: a TOML file, then
//! `SLUICE_*` variables over it.
//!
//! The host (`sluice-host`) and the gateway (`sluice-gateway`) each have
//! one documented settings struct; both read it through these functions
//! and report every problem as a [`ConfigError`] that names the file,
//! variable or setting and what to do about it.

use std::path::{Path, PathBuf};
use std::str::FromStr;

/// A configuration that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// File.
        path: PathBuf,
        /// Cause.
        source: std::io::Error,
    },
    /// The file is not valid TOML or has unknown keys.
    #[error("config {path}: {message}")]
    Parse {
        /// File.
        path: PathBuf,
        /// What the parser said (with line and column).
        message: String,
    },
    /// An environment variable has a bad value.
    #[error("environment variable {name}={value}: {reason}")]
    Env {
        /// Variable.
        name: String,
        /// Its value.
        value: String,
        /// What is wrong.
        reason: String,
    },
    /// A setting is missing, out of range or inconsistent with another
    /// (the message names it: `cores '0-3': ...`, `[nf.fw]: ...`).
    #[error("{0}")]
    Invalid(String),
}

/// The text of the configuration file at `path`.
pub fn read_file(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })
}

/// Parses the text of the file at `path` with `parse` (e.g. a TOML
/// deserializer), its error becoming a [`ConfigError::Parse`] of `path`.
pub fn parse_file<T, E: std::fmt::Display>(
    path: &Path,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, ConfigError> {
    let text = read_file(path)?;
    parse(&text).map_err(|e| ConfigError::Parse { path: path.to_path_buf(), message: e.to_string() })
}

/// The value of variable `name`; an unset or empty one is none.
pub fn env_var(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.is_empty())
}

/// Variable `name` parsed as a `T`; none when it is unset or empty, an
/// error naming the variable and its value when it does not parse.
pub fn env_parse<T: FromStr>(name: &str) -> Result<Option<T>, ConfigError>
where
    T::Err: std::fmt::Display,
{
    env_check(name, |v| v.parse::<T>().map_err(|e| e.to_string()))
}

/// Variable `name` read by `check` (which says what is wrong with a value
/// it refuses); none when it is unset or empty.
pub fn env_check<T>(name: &str, check: impl FnOnce(&str) -> Result<T, String>) -> Result<Option<T>, ConfigError> {
    match env_var(name) {
        None => Ok(None),
        Some(value) => match check(&value) {
            Ok(v) => Ok(Some(v)),
            Err(reason) => Err(ConfigError::Env { name: name.into(), value, reason }),
        },
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn errors_name_the_file_the_variable_and_the_value() {
        let e = read_file(Path::new("/nonexistent/sluice.toml")).unwrap_err();
        assert!(e.to_string().starts_with("cannot read config /nonexistent/sluice.toml"), "{e}");
        let dir = std::env::temp_dir().join(format!("sluice-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("bad.toml");
        std::fs::write(&file, "x = ").unwrap();
        let e = parse_file(&file, |t: &str| t.parse::<u32>()).unwrap_err();
        assert!(matches!(e, ConfigError::Parse { .. }) && e.to_string().contains("bad.toml"), "{e}");
        // Variables: one no process sets, and one every process has.
        assert_eq!(env_parse::<u32>(&format!("SLUICE_TEST_UNSET_{}", std::process::id())).unwrap(), None);
        let path = std::env::var("PATH").unwrap();
        let e = env_parse::<u32>("PATH").unwrap_err();
        assert!(e.to_string().starts_with(&format!("environment variable PATH={path}: ")), "{e}");
        assert_eq!(env_check("PATH", |v| Ok::<_, String>(v.len())).unwrap(), Some(path.len()));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
