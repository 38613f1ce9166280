//! The guest languages Sluice builds NFs from, and what each one's project
//! looks like on disk.

use std::fmt;
use std::path::Path;
use std::str::FromStr;

/// A language an NF can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Lang {
    /// Rust with `sluice-sdk` (`sdk/rust`), built by cargo for `wasm32-wasip2`.
    Rust,
    /// C with `sluice_nf.h` (`sdk/c`), built by clang + wasi-libc and
    /// wrapped into a component with the WASI preview1 adapter.
    C,
    /// Python with `sluice_nf` (`sdk/python`), built by componentize-py.
    Python,
    /// JavaScript (or TypeScript-checked JavaScript) with `@sluice/nf`
    /// (`sdk/js`), bundled by esbuild and built by componentize-js.
    Js,
    /// Go with `sluice.dev/nf` (`sdk/go`), built by Go's wasip1 port as a
    /// reactor and wrapped like C.
    Go,
}

impl Lang {
    /// Every language, in the order tools list them.
    pub const ALL: [Lang; 5] = [Lang::Rust, Lang::C, Lang::Python, Lang::Js, Lang::Go];

    /// The language's name on the command line and in `sluice.toml`.
    pub fn name(self) -> &'static str {
        match self {
            Lang::Rust => "rust",
            Lang::C => "c",
            Lang::Python => "python",
            Lang::Js => "js",
            Lang::Go => "go",
        }
    }

    /// File extension of an NF source in this language.
    pub fn extension(self) -> &'static str {
        match self {
            Lang::Rust => "rs",
            Lang::C => "c",
            Lang::Python => "py",
            Lang::Js => "js",
            Lang::Go => "go",
        }
    }

    /// The NF source of a project, relative to the project directory.
    pub fn main_source(self) -> &'static str {
        match self {
            Lang::Rust => "src/lib.rs",
            Lang::C => "nf.c",
            Lang::Python => "nf.py",
            Lang::Js => "nf.js",
            Lang::Go => "nf.go",
        }
    }

    /// The language of a source file, by extension.
    pub fn of_source(path: &Path) -> Option<Lang> {
        let ext = path.extension()?.to_str()?;
        Lang::ALL.into_iter().find(|l| l.extension() == ext)
    }
}

impl fmt::Display for Lang {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Lang {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "rust" | "rs" => Ok(Lang::Rust),
            "c" => Ok(Lang::C),
            "python" | "py" => Ok(Lang::Python),
            "js" | "javascript" => Ok(Lang::Js),
            "go" | "golang" => Ok(Lang::Go),
            other => Err(format!("unknown language '{other}': use one of rust, c, python, js, go")),
        }
    }
}
