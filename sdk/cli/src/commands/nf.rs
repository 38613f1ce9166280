//! NF projects on this machine: `sluice nf new`, `build`, `test`, `run`
//! and `check` (no gateway).

use super::context::Context;
use crate::args::RunShape;
use crate::print::{emit, out, outln};
use anyhow::{Context as _, Result};
use serde_json::{Value, json};
use sluice_cli::{BuildOptions, Lang, Project, Sdk, Template};
use std::path::{Path, PathBuf};

/// Builds `project` for `nf build|test|run|deploy`, saying so first.
pub fn build_project(project: &Project, sdk: &Sdk, cargo_target_dir: Option<PathBuf>) -> Result<sluice_cli::Built> {
    eprintln!("building {} ({}) ...", project.manifest.name, project.manifest.lang);
    sluice_cli::build(project, sdk, &BuildOptions::with_code_cache(cargo_target_dir))
        .with_context(|| format!("building {}", project.dir.display()))
}

/// `sluice nf new`: a buildable project in `dir/name` from a template.
pub fn new(cx: &Context, name: &str, lang: Lang, template: &str, dir: &Path) -> Result<()> {
    let sdk = cx.projects_sdk()?;
    let template: Template = template.parse()?;
    let project = sluice_cli::new_project(&sdk, dir, name, lang, template)?;
    if cx.json() {
        return emit(&json!({ "project": project, "lang": lang.name(), "sdk": sdk.root() }));
    }
    outln!("created {} ({lang}); next:", project.display());
    outln!("  cd {} && sluice nf build", project.display());
    Ok(())
}

/// `sluice nf build`: the component, checked against the `sluice:nf`
/// world.
pub fn build(cx: &Context, project: &Path, cargo_target_dir: Option<PathBuf>) -> Result<()> {
    // The time printed is the whole command's (SDK install and the
    // contract check included), not the toolchain's alone.
    let started = std::time::Instant::now();
    let sdk = cx.projects_sdk()?;
    let project = Project::open(project)?;
    let built = build_project(&project, &sdk, cargo_target_dir)?;
    if cx.json() {
        return emit(&json!({
            "component": built.path,
            "size": built.size,
            "contract": built.contract,
            "digest": built.digest,
            "seconds": started.elapsed().as_secs_f64(),
        }));
    }
    outln!(
        "{}: {} bytes, sluice:nf@{}, sha256 {} (built in {:.1} s)",
        built.path.display(),
        built.size,
        built.contract,
        built.digest,
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

/// `sluice nf test`: builds the project and runs its test cases (or
/// writes their expected files with `bless`); fails if one failed.
pub fn test(
    cx: &Context,
    project: &Path,
    case: Option<&str>,
    bless: bool,
    shape: RunShape,
    cargo_target_dir: Option<PathBuf>,
) -> Result<()> {
    let as_json = cx.json();
    local_logs()?;
    let sdk = cx.projects_sdk()?;
    let project = Project::open(project)?;
    let shape = project.local_run(shape.workers, shape.batch, shape.spread);
    // What can be wrong without a build is said before one.
    let dirs = sluice_cli::cases::cases(&project, case)?;
    if dirs.is_empty() {
        match case {
            Some(c) => anyhow::bail!("no test case '{c}' in {}", project.dir.join("tests").display()),
            None => anyhow::bail!(
                "no test cases in {}: add a folder tests/<case>/ with input.txt and expected-verdicts.txt (sluice nf new makes one)",
                project.dir.join("tests").display()
            ),
        }
    }
    let built = build_project(&project, &sdk, cargo_target_dir)?;
    let mut results = Vec::new();
    for dir in &dirs {
        // A case that cannot run fails alone; the others still run.
        let r = sluice_cli::cases::run_case(&project, &built.path, dir, shape, bless).unwrap_or_else(|e| {
            sluice_cli::cases::CaseResult {
                name: dir.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default(),
                packets: 0,
                failures: vec![e.to_string()],
                blessed: Vec::new(),
            }
        });
        if !as_json {
            if bless {
                outln!("case {}: wrote {} ({} packets)", r.name, r.blessed.join(", "), r.packets);
            } else if r.passed() {
                outln!("case {} ... ok ({} packets)", r.name, r.packets);
            } else {
                outln!("case {} ... FAILED ({} packets)", r.name, r.packets);
                for f in &r.failures {
                    outln!("{f}");
                }
            }
        }
        results.push(r);
    }
    let failed = results.iter().filter(|r| !r.passed()).count();
    if as_json {
        let cases: Vec<Value> = results
            .iter()
            .map(|r| json!({ "case": r.name, "packets": r.packets, "passed": r.passed(), "failures": r.failures, "blessed": r.blessed }))
            .collect();
        emit(&json!({ "cases": cases, "failed": failed }))?;
    } else if !bless {
        outln!("{} case(s), {} passed, {failed} failed", results.len(), results.len() - failed);
    }
    if failed > 0 && !bless {
        anyhow::bail!("{failed} test case(s) failed");
    }
    Ok(())
}

/// `sluice nf run`: builds the project and runs it here on `input`,
/// writing what it forwards to `out`; prints the report.
pub fn run(
    cx: &Context,
    project: &Path,
    input: &Path,
    out: Option<PathBuf>,
    config_file: Option<&Path>,
    shape: RunShape,
    cargo_target_dir: Option<PathBuf>,
) -> Result<()> {
    local_logs()?;
    let sdk = cx.projects_sdk()?;
    let project = Project::open(project)?;
    let shape = project.local_run(shape.workers, shape.batch, shape.spread);
    // The inputs are read before the build, so that a wrong path
    // is said at once.
    let config = match config_file {
        Some(f) => Some(
            String::from_utf8(std::fs::read(f).with_context(|| format!("reading {}", f.display()))?)
                .with_context(|| format!("{} is not UTF-8", f.display()))?,
        ),
        None => None,
    };
    let input = sluice_cli::cases::input_capture(input, &project.build_dir().join("run"))?;
    let built = build_project(&project, &sdk, cargo_target_dir)?;
    let host = project.host_config(config, shape);
    let opts = sluice_host::RunOptions {
        nfs: vec![built.path.clone()],
        chain: None,
        swaps: vec![],
        input,
        output: out,
        progress: false,
    };
    let report = sluice_host::run(&host, &opts).context("running the NF")?;
    if cx.json() {
        emit(&report)?;
    } else {
        out!("{}", report.summary());
    }
    Ok(())
}

/// Logs of an NF run here, on stderr as `SLUICE_LOG` and
/// `SLUICE_LOG_FORMAT` say: by default the host's warnings (why a batch
/// was refused, a trap and its cause) and the NF's own log lines from
/// `info` up, which is what its author runs it here to see.
fn local_logs() -> Result<()> {
    sluice_telemetry::init_logs("warn,sluice::guest=info").context("starting the log")
}

/// `sluice nf check`: a component file against the `sluice:nf` world.
pub fn check(cx: &Context, component: &Path) -> Result<()> {
    let name = component.file_stem().and_then(|s| s.to_str()).unwrap_or("nf").to_string();
    let checked = sluice_cli::check::check_file(component, &name, None, None)?;
    if cx.json() {
        return emit(&json!({
            "component": component,
            "contract": checked.contract,
            "size": checked.size,
            "digest": checked.digest,
        }));
    }
    outln!(
        "{}: ok, sluice:nf@{}, {} bytes, sha256 {}",
        component.display(),
        checked.contract,
        checked.size,
        checked.digest
    );
    Ok(())
}
