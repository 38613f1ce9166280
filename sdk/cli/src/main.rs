//! `sluice`: the developer and tenant CLI. The command line is defined in
//! [`args`], each group of commands runs in its module of [`commands`],
//! and [`print`] writes what they print.

mod args;
mod commands;
mod print;

/// Parses the command line, runs its command, and ends with status 1 and
/// the error on stderr when it failed.
fn main() -> std::process::ExitCode {
    let cli = <args::Cli as clap::FromArgMatches>::from_arg_matches(&args::command().get_matches())
        .unwrap_or_else(|e| e.exit());
    match commands::run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::from(1)
        }
    }
}
