//! Building a project into a `sluice:nf` component, one toolchain per
//! language, and checking the result the way a gateway upload is checked.
//!
//! - Rust: `cargo build --target wasm32-wasip2` (cargo makes the component).
//! - C: Debian's clang + lld + wasi-libc compile a reactor core module with
//!   the generated bindings in `sdk/c/gen`; wit-component wraps it with the
//!   WASI preview1 adapter of the same wasmtime version as the host.
//! - Python: componentize-py (PyPI) with `sdk/python` on the module path.
//! - JavaScript: esbuild bundles the NF with `sdk/js` into one module, and
//!   componentize-js (npm, installed in `sdk/js/node_modules`) builds it.
//! - Go: `GOOS=wasip1 go build -buildmode=c-shared` makes a reactor core
//!   module with `sdk/go`'s hand-written canonical-ABI glue; the contract's
//!   component type is embedded here, and its WASI imports are answered by
//!   a stateless shim (`wasi_shim`) instead of the standard adapter.

use crate::error::{CliError, io};
use crate::project::Project;
use crate::sdk::Sdk;
use crate::{Lang, check};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// How to build.
#[derive(Debug, Clone)]
pub struct BuildOptions {
    /// Cargo's target directory for Rust projects (default: the project's
    /// own `target/`). Sharing one across projects saves rebuilding the SDK.
    pub cargo_target_dir: Option<PathBuf>,
    /// Compiled-code cache for the contract check (speeds up re-checks).
    pub cache_dir: Option<PathBuf>,
}

impl BuildOptions {
    /// Builds that share the compiled-code cache the host's runs use
    /// (`sluice_host::HostConfig`'s `cache_dir`, `~/.cache/sluice` by
    /// default): the check compiles a component once, and `nf test` and
    /// `nf run` then load it from there instead of compiling it again.
    pub fn with_code_cache(cargo_target_dir: Option<PathBuf>) -> Self {
        let dir = sluice_host::HostConfig::default().cache_dir;
        BuildOptions { cargo_target_dir, cache_dir: (!dir.as_os_str().is_empty()).then_some(dir) }
    }
}

/// A built and checked component.
#[derive(Debug, Clone)]
pub struct Built {
    /// Where it was written.
    pub path: PathBuf,
    /// Its size in bytes.
    pub size: usize,
    /// The contract version it was checked against.
    pub contract: &'static str,
    /// SHA-256 of the component, hex.
    pub digest: String,
    /// Time spent in the language's toolchain.
    pub build_time: Duration,
}

/// Builds `project` into `build/<name>.wasm` and checks it.
pub fn build(project: &Project, sdk: &Sdk, opts: &BuildOptions) -> Result<Built, CliError> {
    let build_dir = project.build_dir();
    std::fs::create_dir_all(&build_dir).map_err(io("creating", &build_dir))?;
    let out = project.component();
    let source = project.source();
    if !source.is_file() {
        return Err(CliError::Manifest {
            path: project.dir.join(crate::project::MANIFEST),
            reason: format!("the NF source {} does not exist", source.display()),
        });
    }
    // The project names the SDK through its `.sluice/sdk` link.
    sdk.link_into(&project.dir)?;
    let started = Instant::now();
    let inputs = inputs_digest(project, sdk)?;
    let stamp = project.build_dir().join(format!("{}.inputs", project.manifest.name));
    if !reusable(&stamp, &inputs, &out) {
        let _ = std::fs::remove_file(&stamp);
        match project.manifest.lang {
            Lang::Rust => build_rust(project, opts, &out)?,
            Lang::C => build_c(project, sdk, &source, &out)?,
            Lang::Python => build_python(project, sdk, &source, &out)?,
            Lang::Js => build_js(project, sdk, &source, &out)?,
            Lang::Go => build_go(project, sdk, &out)?,
        }
        let component = std::fs::read(&out).map_err(io("reading", &out))?;
        std::fs::write(&stamp, format!("{inputs} {}\n", sha256(&component))).map_err(io("writing", &stamp))?;
    }
    let build_time = started.elapsed();
    let checked =
        check::check_file(&out, &project.manifest.name, Some(project.manifest.lang), opts.cache_dir.as_deref())?;
    Ok(Built { path: out, size: checked.size, contract: checked.contract, digest: checked.digest, build_time })
}

/// A digest of everything a build reads: the project's sources, the SDK's
/// contents, this tool's version and the language toolchain's own
/// `--version`. Python and
/// JavaScript toolchains snapshot a running interpreter, whose memory holds
/// random hash seeds, clocks and temporary paths, so the same sources never
/// give the same bytes twice; a build with the same inputs as the last one
/// therefore keeps the component it made, and an unchanged project
/// redeploys under its version and loads from the code cache.
fn inputs_digest(project: &Project, sdk: &Sdk) -> Result<String, CliError> {
    let (program, args): (std::ffi::OsString, &[&str]) = match project.manifest.lang {
        Lang::Rust => (std::env::var_os("RUSTC").unwrap_or_else(|| "rustc".into()), &["--version"]),
        Lang::C => (std::env::var_os("SLUICE_CLANG").unwrap_or_else(|| "clang".into()), &["--version"]),
        Lang::Python => {
            (std::env::var_os("SLUICE_COMPONENTIZE_PY").unwrap_or_else(|| "componentize-py".into()), &["--version"])
        }
        Lang::Js => (std::env::var_os("SLUICE_NODE").unwrap_or_else(|| "node".into()), &["--version"]),
        Lang::Go => (std::env::var_os("SLUICE_GO").unwrap_or_else(|| "go".into()), &["version"]),
    };
    // A toolchain that does not start is said by the build itself.
    let toolchain = Command::new(&program)
        .args(args)
        .current_dir(&project.dir)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    let text = format!(
        "sluice {}\nsdk {}\nlang {}\ntoolchain {}\nsources {}\n",
        crate::sdk::VERSION,
        sdk.fingerprint()?,
        project.manifest.lang,
        toolchain.trim(),
        project.sources_digest()?
    );
    Ok(sha256(text.as_bytes()))
}

/// Whether the component at `out` was built from `inputs` (the stamp says
/// so) and is still the one that build wrote.
fn reusable(stamp: &Path, inputs: &str, out: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string(stamp) else { return false };
    let mut words = text.split_whitespace();
    words.next() == Some(inputs) && std::fs::read(out).is_ok_and(|c| words.next() == Some(sha256(&c).as_str()))
}

fn sha256(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

fn build_rust(project: &Project, opts: &BuildOptions, out: &Path) -> Result<(), CliError> {
    let target_dir = opts.cargo_target_dir.clone().unwrap_or_else(|| project.dir.join("target"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(&cargo);
    cmd.arg("build")
        .arg("--release")
        .args(["--target", "wasm32-wasip2"])
        .arg("--manifest-path")
        .arg(project.dir.join("Cargo.toml"))
        .arg("--target-dir")
        .arg(&target_dir)
        .current_dir(&project.dir);
    run(cmd, "cargo", Lang::Rust, "cargo (rustup, with `rustup target add wasm32-wasip2`)", &project.manifest.name)?;
    let crate_file = format!("{}.wasm", project.manifest.name.replace('-', "_"));
    let built = target_dir.join("wasm32-wasip2").join("release").join(crate_file);
    std::fs::copy(&built, out).map_err(io("copying", &built))?;
    Ok(())
}

fn build_c(project: &Project, sdk: &Sdk, source: &Path, out: &Path) -> Result<(), CliError> {
    let c = sdk.lang_dir(Lang::C);
    let core = project.build_dir().join(format!("{}.core.wasm", project.manifest.name));
    let mut cmd = Command::new(std::env::var_os("SLUICE_CLANG").unwrap_or_else(|| "clang".into()));
    cmd.args(["--target=wasm32-wasi", "-O2", "-std=c11", "-Wall", "-Wextra", "-mexec-model=reactor"])
        .arg("-I")
        .arg(c.join("include"))
        .arg("-I")
        .arg(c.join("gen"))
        .arg("-I")
        .arg(&project.dir)
        .arg(source)
        .arg(c.join("src/sluice_nf.c"))
        .arg(c.join("gen/network_function.c"))
        .arg(c.join("gen/network_function_component_type.o"))
        .arg("-Wl,--strip-debug")
        .arg("-o")
        .arg(&core)
        .current_dir(&project.dir);
    run(cmd, "clang", Lang::C, "apt install clang lld wasi-libc libclang-rt-14-dev-wasm32 (or `make setup`)", source)?;
    let bytes = std::fs::read(&core).map_err(io("reading", &core))?;
    let component = componentize(&bytes).map_err(|reason| CliError::Componentize { path: core.clone(), reason })?;
    std::fs::write(out, component).map_err(io("writing", out))
}

/// Wraps a core module that carries its `sluice:nf` component-type section
/// into a component, adapting WASI preview1 imports (wasi-libc's) to the
/// preview2 interfaces the host provides.
pub fn componentize(core: &[u8]) -> Result<Vec<u8>, String> {
    wit_component::ComponentEncoder::default()
        .module(core)
        .and_then(|e| {
            e.adapter(
                "wasi_snapshot_preview1",
                wasi_preview1_component_adapter_provider::WASI_SNAPSHOT_PREVIEW1_REACTOR_ADAPTER,
            )
        })
        .and_then(|e| e.validate(true).encode())
        .map_err(|e| format!("{e:#}"))
}

fn build_go(project: &Project, sdk: &Sdk, out: &Path) -> Result<(), CliError> {
    let core = project.build_dir().join(format!("{}.core.wasm", project.manifest.name));
    let mut cmd = Command::new(std::env::var_os("SLUICE_GO").unwrap_or_else(|| "go".into()));
    cmd.args(["build", "-buildmode=c-shared", "-trimpath", "-o"])
        .arg(&core)
        .arg(".")
        .env("GOOS", "wasip1")
        .env("GOARCH", "wasm")
        .env("GOFLAGS", "-mod=mod")
        .current_dir(&project.dir);
    run(
        cmd,
        "go",
        Lang::Go,
        "install Go 1.24 or newer (go.dev/dl, or Debian's golang when it is new enough)",
        &project.dir,
    )?;
    let mut bytes = std::fs::read(&core).map_err(io("reading", &core))?;
    let fail = |reason: String| CliError::Componentize { path: core.clone(), reason };
    embed_contract(&mut bytes, &sdk.wit_dir(Lang::Go)).map_err(fail)?;
    let shim = crate::wasi_shim::build(&bytes, &sdk.wit_dir(Lang::Go)).map_err(fail)?;
    let component = wit_component::ComponentEncoder::default()
        .module(&bytes)
        .and_then(|e| e.adapter("wasi_snapshot_preview1", &shim))
        .and_then(|e| e.validate(true).encode())
        .map_err(|e| fail(format!("{e:#}")))?;
    std::fs::write(out, component).map_err(io("writing", out))
}

/// Adds the `sluice:nf` world's component-type section to a core module
/// whose toolchain cannot (Go's), so that wit-component knows which of its
/// imports and exports are the contract's.
fn embed_contract(core: &mut Vec<u8>, wit_dir: &Path) -> Result<(), String> {
    let mut resolve = wit_parser::Resolve::default();
    let (pkg, _) =
        resolve.push_dir(wit_dir).map_err(|e| format!("reading the contract {}: {e:#}", wit_dir.display()))?;
    let world = resolve.select_world(&[pkg], Some("network-function")).map_err(|e| format!("{e:#}"))?;
    wit_component::embed_component_metadata(core, &resolve, world, wit_component::StringEncoding::UTF8)
        .map_err(|e| format!("{e:#}"))
}

fn build_python(project: &Project, sdk: &Sdk, source: &Path, out: &Path) -> Result<(), CliError> {
    let module = source.file_stem().and_then(|s| s.to_str()).unwrap_or("nf");
    let src_dir = source.parent().unwrap_or(&project.dir);
    let mut cmd = Command::new(std::env::var_os("SLUICE_COMPONENTIZE_PY").unwrap_or_else(|| "componentize-py".into()));
    cmd.arg("-d")
        .arg(sdk.wit_dir(Lang::Python))
        .args(["-w", "network-function", "componentize", module, "-p"])
        .arg(src_dir)
        .arg("-p")
        .arg(sdk.lang_dir(Lang::Python))
        .arg("-o")
        .arg(out)
        .current_dir(&project.dir);
    run(cmd, "componentize-py", Lang::Python, "pip install componentize-py==0.25.1 (or `make setup`)", source).map_err(
        |e| match e {
            CliError::ToolFailed { output, .. } if python_syntax_error(&output).is_some() => CliError::PythonSyntax {
                error: python_syntax_error(&output)
                    .unwrap_or_default()
                    .replace("\"/0/", &format!("\"{}/", src_dir.display()))
                    .replace("\"/1/", &format!("\"{}/", sdk.lang_dir(Lang::Python).display())),
            },
            e => e,
        },
    )
}

/// The Python compiler's own report of a syntax error (`File "...", line
/// N`, the line, the caret, `SyntaxError: ...`) out of componentize-py's
/// output, where it comes wrapped in the tool's traceback.
fn python_syntax_error(output: &str) -> Option<String> {
    let lines: Vec<&str> = output.lines().collect();
    let last = lines
        .iter()
        .position(|l| ["SyntaxError:", "IndentationError:", "TabError:"].iter().any(|k| l.starts_with(k)))?;
    let first = lines.get(..last)?.iter().rposition(|l| l.contains("File \""))?;
    let block = lines.get(first..=last)?;
    let head = block.first()?;
    let head = head.get(head.find("File \"")?..)?;
    Some(
        std::iter::once(format!("  {head}"))
            .chain(block.iter().skip(1).map(|l| l.to_string()))
            .collect::<Vec<_>>()
            .join("\n"),
    )
}

fn build_js(project: &Project, sdk: &Sdk, source: &Path, out: &Path) -> Result<(), CliError> {
    let js = sdk.lang_dir(Lang::Js);
    let bin = js.join("node_modules/.bin");
    if !bin.join("componentize-js").exists() {
        // An installed SDK gets its toolchain on the first build, at the
        // versions of its lock file.
        eprintln!("installing the JavaScript toolchain (componentize-js, esbuild) in {} ...", js.display());
        let mut npm = Command::new(std::env::var_os("SLUICE_NPM").unwrap_or_else(|| "npm".into()));
        npm.args(["ci", "--no-audit", "--no-fund", "--prefer-offline", "--loglevel=error"]).current_dir(&js);
        run(npm, "npm", Lang::Js, "install Node.js 20 or newer with npm", &js)?;
    }
    let work = project.build_dir().join("js");
    std::fs::create_dir_all(&work).map_err(io("creating", &work))?;
    let bundle = work.join("bundle.js");
    let mut esbuild = Command::new(bin.join("esbuild"));
    esbuild
        .arg(source)
        .args(["--bundle", "--format=esm", "--platform=neutral", "--log-level=warning"])
        .arg(format!("--alias:@sluice/nf={}", js.join("src/index.js").display()))
        .arg("--external:sluice:nf/*")
        .arg(format!("--outfile={}", bundle.display()))
        .current_dir(&project.dir);
    run(esbuild, "esbuild", Lang::Js, "run `npm ci` in the SDK's js folder (or `make setup`)", source)?;
    // componentize-js reads the WIT through a sandbox that only sees the
    // bundle's directory, so the contract is copied next to it.
    let wit = work.join("wit");
    std::fs::create_dir_all(&wit).map_err(io("creating", &wit))?;
    let nf_wit = sdk.wit_dir(Lang::Js).join("nf.wit");
    std::fs::copy(&nf_wit, wit.join("nf.wit")).map_err(io("copying", &nf_wit))?;
    let mut cmd = Command::new(bin.join("componentize-js"));
    cmd.arg(&bundle)
        .arg("-w")
        .arg(&wit)
        .args(["-n", "network-function", "-d", "http", "-d", "fetch-event", "-o"])
        .arg(out)
        .current_dir(&work);
    run(cmd, "componentize-js", Lang::Js, "run `npm ci` in the SDK's js folder (or `make setup`)", source)
}

/// Runs a toolchain command; a missing program or a failure becomes an
/// error carrying the end of its output.
fn run(mut cmd: Command, tool: &str, lang: Lang, hint: &'static str, what: impl AsRef<Path>) -> Result<(), CliError> {
    let program = cmd.get_program().to_string_lossy().into_owned();
    // Toolchains written in Rust (componentize-py, componentize-js's
    // engine) would follow their own error with a backtrace the user's
    // RUST_BACKTRACE asked of `sluice`, burying the message.
    cmd.env("RUST_BACKTRACE", "0").env("RUST_LIB_BACKTRACE", "0");
    let output = cmd.output().map_err(|e| CliError::MissingTool {
        lang: lang.name(),
        tool: tool.to_string(),
        detail: format!("running {program}: {e}"),
        hint,
    })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stdout));
    let lines: Vec<&str> = text.lines().collect();
    let tail = lines.get(lines.len().saturating_sub(40)..).unwrap_or_default().join("\n");
    Err(CliError::ToolFailed {
        tool: tool.to_string(),
        status: output.status.to_string(),
        what: what.as_ref().display().to_string(),
        output: tail,
    })
}

#[cfg(test)]
mod tests {
    use super::python_syntax_error;

    #[test]
    fn a_python_syntax_error_is_taken_out_of_componentize_py_s_traceback() {
        let output = "Traceback (most recent call last):\n  File \"/usr/bin/componentize-py\", line 8, in <module>\n    sys.exit(script())\n             ^^^^^^^^\nAssertionError:   File \"/0/nf.py\", line 20\n    rst = p.tcp_flags() & TCP_RST (\n                                  ^\nSyntaxError: '(' was never closed\n\n\nCaused by:\n    SyntaxError: '(' was never closed (nf.py, line 20)\n";
        assert_eq!(
            python_syntax_error(output).as_deref(),
            Some(
                "  File \"/0/nf.py\", line 20\n    rst = p.tcp_flags() & TCP_RST (\n                                  ^\nSyntaxError: '(' was never closed"
            )
        );
        assert_eq!(python_syntax_error("error: no such module"), None);
    }
}
