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
//! then `sdk/<version>-<digest of its contents>/`), which neither moves
//! nor changes when the tarball or checkout does, and a project reaches it
//! through its own `.sluice/sdk` link, which every build renews (so the
//! project holds no absolute path). In that copy the Rust SDK is a crate of
//! its own (its workspace settings resolved, the crates it uses vendored
//! beside it), so a project needs no checkout.

use crate::error::{CliError, io};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The newest contract version: the one the Python and JavaScript SDKs
/// build against (their answers as one result frame, `sluice:nf@0.7.0`).
pub const CONTRACT_VERSION: &str = "0.7.0";

/// The contract version the Rust, C and Go SDKs build against (the batch
/// as one frame, `sluice:nf@0.6.0`): their bindings lower and lift the
/// result's records for a few nanoseconds, where componentize-py and
/// StarlingMonkey make an object per record and variant.
pub const COMPILED_CONTRACT_VERSION: &str = "0.6.0";

/// The contract version an SDK builds against, and the one whose WIT its
/// builds embed (C, Go) or generate bindings from (Python, JS); the host
/// loads every released version.
pub fn contract_version(lang: crate::Lang) -> &'static str {
    match lang {
        crate::Lang::Python | crate::Lang::Js => CONTRACT_VERSION,
        crate::Lang::Rust | crate::Lang::C | crate::Lang::Go => COMPILED_CONTRACT_VERSION,
    }
}

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

    /// The WIT package directory of the contract `lang` builds against.
    pub fn wit_dir(&self, lang: crate::Lang) -> PathBuf {
        self.root.join("wit").join(format!("v{}", contract_version(lang)))
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
    /// the user's data directory as `sdk/<version>-<digest>/`, named by a
    /// digest of its contents. A copy is written once (aside, then renamed
    /// into place) and never changed: two `sluice` binaries of one version
    /// with different SDKs (a release and a checkout) get two copies, and
    /// a build never sees another `sluice` rewrite the one it compiles
    /// against.
    pub fn for_projects(&self) -> Result<Sdk, CliError> {
        let base = data_dir()?.join("sdk");
        if base.canonicalize().is_ok_and(|b| self.root.starts_with(b)) {
            return Ok(self.clone());
        }
        let target = self.projects_copy()?;
        if target.join(STAMP).is_file() {
            return Sdk::at(&target);
        }
        std::fs::create_dir_all(&base).map_err(io("creating", &base))?;
        // Named for this process and call: installs in other processes or
        // threads never share it.
        static INSTALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = INSTALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = base.join(format!(".{VERSION}.{}.{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&tmp);
        self.install(&tmp)?;
        let stamp = format!("{VERSION} from {}\n", self.root.display());
        std::fs::write(tmp.join(STAMP), stamp).map_err(io("writing", tmp.join(STAMP)))?;
        if let Err(e) = std::fs::rename(&tmp, &target) {
            let _ = std::fs::remove_dir_all(&tmp);
            // Another `sluice` installed the same contents meanwhile.
            if !target.join(STAMP).is_file() {
                return Err(io("installing", &target)(e));
            }
        }
        Sdk::at(&target)
    }

    /// Where [`for_projects`](Self::for_projects) installs this SDK (or
    /// finds it installed): `sdk/<version>-<digest>/` under the user's
    /// data directory.
    pub fn projects_copy(&self) -> Result<PathBuf, CliError> {
        Ok(data_dir()?.join("sdk").join(format!("{VERSION}-{}", self.fingerprint()?)))
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

    /// A digest of what [`install`](Self::install) copies (paths and
    /// contents), 16 hex digits: it changes exactly when the SDK does.
    pub fn fingerprint(&self) -> Result<String, CliError> {
        let langs = crate::Lang::ALL.map(|l| self.lang_dir(l));
        let others = ["wit", "host/wire", "host/state", "Cargo.lock"].map(|d| self.root.join(d));
        let dirs: Vec<PathBuf> = langs.into_iter().chain(others).collect();
        Ok(digest_files(&self.root, &dirs, &|_| true)?.chars().take(16).collect())
    }

    /// Points `<project>/.sluice/sdk` at this SDK. Projects name the SDK
    /// through that link (`.sluice/sdk/sdk/go`, ...), never by an absolute
    /// path, so they can move between machines and users; every build
    /// renews it.
    pub fn link_into(&self, project_dir: &Path) -> Result<(), CliError> {
        let dir = project_dir.join(".sluice");
        std::fs::create_dir_all(&dir).map_err(io("creating", &dir))?;
        let link = dir.join("sdk");
        if std::fs::read_link(&link).is_ok_and(|t| t == self.root) {
            return Ok(());
        }
        let tmp = dir.join(format!(".sdk.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&self.root, &tmp).map_err(io("linking", &tmp))?;
        std::fs::rename(&tmp, &link).map_err(io("linking", &link))
    }
}

/// Where a project reaches the SDK it builds against: the link
/// [`Sdk::link_into`] keeps, relative to the project.
pub const PROJECT_SDK_LINK: &str = ".sluice/sdk";

/// Entries a copy leaves out: build outputs, caches, installed packages.
fn skipped(name: &str) -> bool {
    matches!(name, "target" | "node_modules" | "__pycache__" | "build" | ".git" | ".sluice" | STAMP)
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

/// SHA-256 (hex) of the files under `paths` that `keep` accepts, sorted,
/// each as its path relative to `root` and its contents: it changes
/// exactly when a file is added, removed, renamed or edited.
pub(crate) fn digest_files(root: &Path, paths: &[PathBuf], keep: &dyn Fn(&Path) -> bool) -> Result<String, CliError> {
    use sha2::Digest;
    let mut h = sha2::Sha256::new();
    let mut failed = None;
    for path in paths {
        walk(path, &mut |p, _| {
            if !keep(p) {
                return;
            }
            h.update(p.strip_prefix(root).unwrap_or(p).as_os_str().as_encoded_bytes());
            h.update([0]);
            match std::fs::read(p) {
                Ok(bytes) => {
                    h.update((bytes.len() as u64).to_le_bytes());
                    h.update(&bytes);
                }
                Err(e) => failed = failed.take().or(Some(io("reading", p)(e))),
            }
        })?;
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(hex::encode(h.finalize())),
    }
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
