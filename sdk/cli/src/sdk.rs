//! Where the Sluice SDK lives: the WIT contract and the per-language SDK
//! folders that builds compile against.
//!
//! A `sluice` binary finds an SDK next to itself (`<prefix>/share/sluice`
//! beside `<prefix>/bin/sluice`, as the release tarball lays it out), or
//! the checkout it was built in (`<checkout>/target/<profile>/sluice`),
//! or where `--sdk-root` / `SLUICE_SDK_ROOT` say; never through the path
//! it was compiled at. Projects do not reference that SDK: [`Sdk::for_projects`]
//! installs a standalone copy under the user's data directory
//! (`$SLUICE_DATA_DIR`, `$XDG_DATA_HOME/sluice` or `~/.local/share/sluice`,
//! then `sdk/<version>/`), and projects depend on that copy, which neither
//! moves nor changes when the tarball or checkout does. In that copy the
//! Rust SDK is a crate of its own (its workspace settings resolved, the
//! crates it uses vendored beside it), so a project needs no checkout.

use crate::error::{CliError, io};
use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};

/// The contract version new projects and builds target.
pub const CONTRACT_VERSION: &str = "0.3.0";

/// The version of this tool (and of the SDK it installs).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The file an installed SDK keeps its origin in.
const STAMP: &str = ".sluice-sdk";

/// A Sluice checkout or an installed SDK, holding `wit/` and `sdk/`.
#[derive(Debug, Clone)]
pub struct Sdk {
    root: PathBuf,
}

/// The user's data directory for Sluice: `$SLUICE_DATA_DIR`, else
/// `$XDG_DATA_HOME/sluice`, else `$HOME/.local/share/sluice`.
pub fn data_dir() -> Result<PathBuf, CliError> {
    let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty()).map(PathBuf::from);
    if let Some(d) = var("SLUICE_DATA_DIR") {
        return Ok(d);
    }
    if let Some(d) = var("XDG_DATA_HOME") {
        return Ok(d.join("sluice"));
    }
    var("HOME").map(|h| h.join(".local/share/sluice")).ok_or(CliError::NoDataDir)
}

impl Sdk {
    /// The SDK at `root`, checked to hold the current contract.
    pub fn at(root: &Path) -> Result<Self, CliError> {
        let root = root.canonicalize().map_err(|_| CliError::NoSdk(root.to_path_buf()))?;
        if !root.join("wit").join(format!("v{CONTRACT_VERSION}")).join("nf.wit").is_file() {
            return Err(CliError::NoSdk(root));
        }
        Ok(Sdk { root })
    }

    /// `explicit`, else `SLUICE_SDK_ROOT`, else next to this executable:
    /// `<prefix>/share/sluice` for `<prefix>/bin/sluice`, or the checkout
    /// whose `target/<profile>/` holds it.
    pub fn locate(explicit: Option<&Path>) -> Result<Self, CliError> {
        if let Some(p) = explicit {
            return Sdk::at(p);
        }
        if let Some(p) = std::env::var_os("SLUICE_SDK_ROOT").filter(|p| !p.is_empty()) {
            return Sdk::at(Path::new(&p));
        }
        let exe =
            std::env::current_exe().and_then(|e| e.canonicalize()).map_err(io("locating", "the sluice binary"))?;
        let dir = exe.parent().unwrap_or(Path::new("/"));
        let candidates: Vec<PathBuf> =
            [dir.parent().map(|p| p.join("share/sluice")), dir.parent().and_then(Path::parent).map(Path::to_path_buf)]
                .into_iter()
                .flatten()
                .collect();
        candidates
            .iter()
            .find_map(|c| Sdk::at(c).ok())
            .ok_or_else(|| CliError::SdkNotFound(candidates.iter().map(|c| c.display().to_string()).collect()))
    }

    /// The SDK's root.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The WIT package directory of the current contract.
    pub fn wit_dir(&self) -> PathBuf {
        self.root.join("wit").join(format!("v{CONTRACT_VERSION}"))
    }

    /// A language SDK's folder (`sdk/rust`, `sdk/c`, ...).
    pub fn lang_dir(&self, lang: crate::Lang) -> PathBuf {
        self.root.join("sdk").join(lang.name())
    }

    /// A checkout (a Cargo workspace), not an installed copy.
    fn is_checkout(&self) -> bool {
        std::fs::read_to_string(self.root.join("Cargo.toml")).is_ok_and(|t| t.contains("[workspace]"))
    }

    /// The standalone copy projects reference: this SDK installed under
    /// the user's data directory (`sdk/<version>/`), first or again when
    /// this one changed since.
    pub fn for_projects(&self) -> Result<Sdk, CliError> {
        let target = data_dir()?.join("sdk").join(VERSION);
        if self.root == target.canonicalize().unwrap_or_default() {
            return Ok(self.clone());
        }
        let stamp = format!("{VERSION} {} {:016x}\n", self.root.display(), self.fingerprint()?);
        if std::fs::read_to_string(target.join(STAMP)).is_ok_and(|s| s == stamp) {
            return Sdk::at(&target);
        }
        let parent = target.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
        // Built aside and renamed into place: another `sluice` never sees
        // half a copy.
        let tmp = parent.join(format!(".{VERSION}.{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        self.install(&tmp)?;
        std::fs::write(tmp.join(STAMP), &stamp).map_err(io("writing", tmp.join(STAMP)))?;
        let old = parent.join(format!(".{VERSION}.old.{}", std::process::id()));
        let _ = std::fs::rename(&target, &old);
        let placed = std::fs::rename(&tmp, &target);
        let _ = std::fs::remove_dir_all(&old);
        if let Err(e) = placed {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another `sluice` installed the same copy meanwhile.
            if !std::fs::read_to_string(target.join(STAMP)).is_ok_and(|s| s == stamp) {
                return Err(io("installing", &target)(e));
            }
        }
        Sdk::at(&target)
    }

    /// Writes a standalone SDK to `to`: the WIT packages, every language's
    /// SDK, and the Rust SDK as a crate of its own with the crates it uses
    /// beside it (`sdk/rust/vendor/`) and the lock file its builds start from.
    pub fn install(&self, to: &Path) -> Result<Sdk, CliError> {
        copy_tree(&self.root.join("wit"), &to.join("wit"))?;
        for lang in crate::Lang::ALL {
            let from = self.lang_dir(lang);
            let dest = to.join("sdk").join(lang.name());
            if lang == crate::Lang::Rust && self.is_checkout() {
                vendor_rust(&self.root, &dest)?;
            } else {
                copy_tree(&from, &dest)?;
            }
        }
        // The JavaScript toolchain (componentize-js, esbuild) is not
        // copied: a checkout's is linked, else `nf build` installs it.
        let js_tools = self.lang_dir(crate::Lang::Js).join("node_modules");
        if js_tools.join(".bin/componentize-js").exists() {
            let link = to.join("sdk/js/node_modules");
            std::os::unix::fs::symlink(js_tools.canonicalize().map_err(io("resolving", &js_tools))?, &link)
                .map_err(io("linking", &link))?;
        }
        Sdk::at(to)
    }

    /// A digest of what [`install`](Self::install) copies (paths, sizes,
    /// modification times): it changes when the SDK does.
    fn fingerprint(&self) -> Result<u64, CliError> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        let langs = crate::Lang::ALL.map(|l| self.lang_dir(l));
        let others = ["wit", "host/wire", "host/state", "Cargo.lock"].map(|d| self.root.join(d));
        for dir in langs.iter().chain(&others) {
            walk(dir, &mut |p, meta| {
                p.hash(&mut h);
                meta.len().hash(&mut h);
                meta.modified().ok().hash(&mut h);
            })?;
        }
        Ok(h.finish())
    }
}

/// Entries a copy leaves out: build outputs, caches, installed packages.
fn skipped(name: &str) -> bool {
    matches!(name, "target" | "node_modules" | "__pycache__" | "build" | ".git" | STAMP)
}

/// Calls `f` for every file under `path` (or `path` itself), sorted.
pub(crate) fn walk(path: &Path, f: &mut dyn FnMut(&Path, &std::fs::Metadata)) -> Result<(), CliError> {
    let Ok(meta) = std::fs::metadata(path) else { return Ok(()) };
    if meta.is_file() {
        f(path, &meta);
        return Ok(());
    }
    let mut entries: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(io("reading", path))?
        .filter_map(Result::ok)
        .filter(|e| !skipped(&e.file_name().to_string_lossy()))
        .map(|e| e.path())
        .collect();
    entries.sort();
    for e in entries {
        walk(&e, f)?;
    }
    Ok(())
}

/// Copies the files under `from` to `to`, leaving out [`skipped`] entries.
fn copy_tree(from: &Path, to: &Path) -> Result<(), CliError> {
    let mut result = Ok(());
    walk(from, &mut |p, _| {
        if result.is_err() {
            return;
        }
        let dest = match p.strip_prefix(from) {
            Ok(rel) if !rel.as_os_str().is_empty() => to.join(rel),
            _ => to.to_path_buf(),
        };
        result = dest
            .parent()
            .map_or(Ok(()), |d| std::fs::create_dir_all(d).map_err(io("creating", d)))
            .and_then(|()| std::fs::copy(p, &dest).map(|_| ()).map_err(io("copying", p)));
    })?;
    result
}

/// The Rust SDK of checkout `root` as a standalone crate at `to`: its
/// manifest's workspace settings resolved, the workspace crates it uses
/// (found through `[workspace.dependencies]` paths) copied to
/// `to/vendor/<name>/` with theirs resolved too, and the checkout's lock
/// file beside it for projects to start from.
fn vendor_rust(root: &Path, to: &Path) -> Result<(), CliError> {
    let ws_path = root.join("Cargo.toml");
    let bad = |reason: String| CliError::Manifest { path: ws_path.clone(), reason };
    let ws: toml::Table = std::fs::read_to_string(&ws_path)
        .map_err(io("reading", &ws_path))?
        .parse()
        .map_err(|e: toml::de::Error| bad(e.to_string()))?;
    let workspace = ws.get("workspace").and_then(toml::Value::as_table).ok_or_else(|| bad("no [workspace]".into()))?;
    let package = workspace.get("package").and_then(toml::Value::as_table).cloned().unwrap_or_default();
    let deps = workspace.get("dependencies").and_then(toml::Value::as_table).cloned().unwrap_or_default();
    // Workspace crates by name, with their directories.
    let internal: BTreeMap<String, PathBuf> = deps
        .iter()
        .filter_map(|(name, spec)| Some((name.clone(), root.join(spec.as_table()?.get("path")?.as_str()?))))
        .collect();
    let mut pending = vec![(root.join("sdk/rust"), to.to_path_buf(), "vendor".to_string())];
    let mut done = std::collections::BTreeSet::new();
    while let Some((from, dest, vendor_rel)) = pending.pop() {
        let manifest_path = from.join("Cargo.toml");
        let mut manifest: toml::Table = std::fs::read_to_string(&manifest_path)
            .map_err(io("reading", &manifest_path))?
            .parse()
            .map_err(|e: toml::de::Error| CliError::Manifest { path: manifest_path.clone(), reason: e.to_string() })?;
        manifest.remove("lints");
        manifest.remove("dev-dependencies");
        if let Some(toml::Value::Table(p)) = manifest.get_mut("package") {
            for (k, v) in p.iter_mut() {
                if is_inherited(v)
                    && let Some(w) = package.get(k)
                {
                    *v = w.clone();
                }
            }
        }
        let mut uses = Vec::new();
        let mut resolve = |table: &mut toml::Table| {
            for (name, spec) in table.iter_mut() {
                let local = spec.as_table().cloned().unwrap_or_default();
                if !local.get("workspace").and_then(toml::Value::as_bool).unwrap_or(false) {
                    continue;
                }
                let mut resolved = match deps.get(name) {
                    Some(toml::Value::String(v)) => toml::Table::from_iter([("version".to_string(), v.clone().into())]),
                    Some(toml::Value::Table(t)) => t.clone(),
                    _ => toml::Table::new(),
                };
                for (k, v) in local.into_iter().filter(|(k, _)| k != "workspace") {
                    match (k.as_str(), resolved.get_mut("features"), v) {
                        ("features", Some(toml::Value::Array(have)), toml::Value::Array(more)) => have.extend(more),
                        (_, _, v) => {
                            resolved.insert(k, v);
                        }
                    }
                }
                if internal.contains_key(name) {
                    resolved.remove("version");
                    resolved.insert("path".into(), format!("{vendor_rel}/{name}").into());
                    uses.push(name.clone());
                }
                *spec = toml::Value::Table(resolved);
            }
        };
        for key in ["dependencies", "build-dependencies"] {
            if let Some(toml::Value::Table(t)) = manifest.get_mut(key) {
                resolve(t);
            }
        }
        if let Some(toml::Value::Table(targets)) = manifest.get_mut("target") {
            for (_, cfg) in targets.iter_mut() {
                if let Some(toml::Value::Table(t)) = cfg.get_mut("dependencies") {
                    resolve(t);
                }
            }
        }
        std::fs::create_dir_all(&dest).map_err(io("creating", &dest))?;
        for entry in ["src", "README.md", "build.rs"] {
            let p = from.join(entry);
            if p.exists() {
                copy_tree(&p, &dest.join(entry))?;
            }
        }
        let text = toml::to_string(&manifest)
            .map_err(|e| CliError::Manifest { path: manifest_path.clone(), reason: e.to_string() })?;
        let out = dest.join("Cargo.toml");
        std::fs::write(&out, format!("# Installed by `sluice`: a standalone copy.\n{text}"))
            .map_err(io("writing", &out))?;
        for name in uses {
            if done.insert(name.clone())
                && let Some(dir) = internal.get(&name)
            {
                pending.push((dir.clone(), to.join("vendor").join(&name), "..".to_string()));
            }
        }
    }
    let lock = root.join("Cargo.lock");
    if lock.is_file() {
        std::fs::copy(&lock, to.join("Cargo.lock")).map_err(io("copying", &lock))?;
    }
    Ok(())
}

/// `{ workspace = true }`.
fn is_inherited(v: &toml::Value) -> bool {
    v.as_table().and_then(|t| t.get("workspace")).and_then(toml::Value::as_bool).unwrap_or(false)
}
