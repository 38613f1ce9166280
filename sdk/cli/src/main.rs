//! `sluice`: the developer and tenant CLI.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use sluice_cli::{BuildOptions, Lang, Project, Sdk, Template};
use std::path::PathBuf;

/// Sluice developer CLI: write network functions in Rust, C, Python,
/// JavaScript or Go and build them into sandboxed sluice:nf components.
#[derive(Parser)]
#[command(version, propagate_version = true)]
struct Cli {
    /// The Sluice checkout holding wit/ and sdk/ (default: the one this
    /// tool was built from).
    #[arg(long, global = true, env = "SLUICE_SDK_ROOT")]
    sdk_root: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Network function projects.
    #[command(subcommand)]
    Nf(NfCommand),
}

#[derive(Subcommand)]
enum NfCommand {
    /// Create a buildable NF project in ./<name>/ from a template.
    New {
        /// Project and NF name (a-z, 0-9, '-').
        name: String,
        /// Language: rust, c, python, js or go.
        #[arg(long, short)]
        lang: Lang,
        /// counter (forward and count) or firewall (stateful, inside-out).
        #[arg(long, short, default_value = "counter")]
        template: String,
        /// Create the project under this directory instead of ./.
        #[arg(long, default_value = ".")]
        dir: PathBuf,
    },
    /// Build the project into build/<name>.wasm and check it against the
    /// sluice:nf world (the same check the gateway's upload runs).
    Build {
        /// The project directory.
        #[arg(default_value = ".")]
        project: PathBuf,
        /// Cargo target directory for Rust projects.
        #[arg(long)]
        cargo_target_dir: Option<PathBuf>,
    },
    /// Check a component file against the sluice:nf world.
    Check {
        /// The component (.wasm).
        component: PathBuf,
    },
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Nf(NfCommand::New { name, lang, template, dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?;
            let template: Template = template.parse()?;
            let project = sluice_cli::new_project(&sdk, &dir, &name, lang, template)?;
            println!("created {} ({lang}); next:", project.display());
            println!("  cd {} && sluice nf build", project.display());
        }
        Command::Nf(NfCommand::Build { project, cargo_target_dir }) => {
            let sdk = Sdk::locate(cli.sdk_root.as_deref())?;
            let project = Project::open(&project)?;
            eprintln!("building {} ({}) ...", project.manifest.name, project.manifest.lang);
            let built = sluice_cli::build(&project, &sdk, &BuildOptions { cargo_target_dir, cache_dir: None })
                .with_context(|| format!("building {}", project.dir.display()))?;
            println!(
                "{}: {} bytes, sluice:nf@{}, sha256 {} (built in {:.1} s)",
                built.path.display(),
                built.size,
                built.contract,
                built.digest,
                built.build_time.as_secs_f64()
            );
        }
        Command::Nf(NfCommand::Check { component }) => {
            let name = component.file_stem().and_then(|s| s.to_str()).unwrap_or("nf").to_string();
            let checked = sluice_cli::check::check_file(&component, &name, None)?;
            println!(
                "{}: ok, sluice:nf@{}, {} bytes, sha256 {}",
                component.display(),
                checked.contract,
                checked.size,
                checked.digest
            );
        }
    }
    Ok(())
}
