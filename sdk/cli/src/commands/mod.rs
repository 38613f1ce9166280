//! The commands, one module per group of the command tree; [`run`]
//! dispatches a parsed command line to them.

mod account;
mod context;
mod deployments;
mod dev;
mod events;
mod groups;
mod hosts;
mod logs;
mod modules;
mod nf;
mod sdk;
mod tenants;
mod usage;
mod watch;

use crate::args::{Cli, Command, NfCommand, SdkCommand};
use crate::print::out;
use anyhow::Result;
use context::Context;

/// Runs the command of a parsed command line.
pub fn run(cli: Cli) -> Result<()> {
    let Cli { sdk_root, url, api_key, admin_token, output, command } = cli;
    let cx = Context { sdk_root, url, api_key, admin_token, output };
    let cx = &cx;
    match command {
        Command::Nf(NfCommand::New { name, lang, template, dir }) => nf::new(cx, &name, lang, &template, &dir),
        Command::Nf(NfCommand::Build { project, cargo_target_dir }) => nf::build(cx, &project, cargo_target_dir),
        Command::Nf(NfCommand::Test { project, case, bless, shape, cargo_target_dir }) => {
            nf::test(cx, &project, case.as_deref(), bless, shape, cargo_target_dir)
        }
        Command::Nf(NfCommand::Run { project, input, out, config_file, shape, cargo_target_dir }) => {
            nf::run(cx, &project, &input, out, config_file.as_deref(), shape, cargo_target_dir)
        }
        Command::Nf(NfCommand::Check { component }) => nf::check(cx, &component),
        Command::Nf(NfCommand::Deploy { project, wait, cargo_target_dir }) => {
            deployments::nf_deploy(cx, &project, wait, cargo_target_dir)
        }
        Command::Nf(NfCommand::Watch { project, args }) => watch::nf_watch(cx, &project, args),
        Command::Nf(NfCommand::Upload { file, name, version }) => modules::upload(cx, &file, name, &version),
        Command::Nf(NfCommand::List) => modules::list(cx),
        Command::Nf(NfCommand::Delete { module }) => modules::delete(cx, &module),
        Command::Sdk(SdkCommand::Path) => sdk::path(cx),
        Command::Sdk(SdkCommand::Install { to }) => sdk::install(cx, to),
        Command::Completions { shell } => {
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut crate::args::command(), "sluice", &mut script);
            out!("{}", String::from_utf8_lossy(&script));
            Ok(())
        }
        Command::Dev(args) => dev::dev(cx, args),
        Command::Tenant(c) => tenants::run(cx, c),
        Command::Host(c) => hosts::run(cx, c),
        Command::Groups { command } => groups::run(cx, command),
        Command::Dashboard => account::dashboard(cx),
        Command::Key(c) => account::key(cx, c),
        Command::Deploy(args) => deployments::deploy(cx, args),
        Command::Deployments => deployments::list(cx),
        Command::Undeploy { name } => deployments::undeploy(cx, &name),
        Command::Events { deployment, kind, since, limit } => events::events(cx, deployment, kind, since, limit),
        Command::Logs { deployment, nf, level, since, limit, follow } => {
            logs::logs(cx, deployment, nf, &level, since, limit, follow)
        }
        Command::Usage { from, to, json } => usage::usage(cx, from, to, json),
        Command::Bill { period, csv, json } => usage::bill(cx, &period, csv, json),
    }
}
