//! The `sluice` developer CLI as a library: scaffolding NF projects in
//! every supported language ([`scaffold`]), building them into `sluice:nf`
//! components ([`build`]), and the contract check a gateway upload gets
//! ([`check`]). The conformance suite drives the same functions, so what it
//! proves about a language holds for `sluice nf build`.

pub mod build;
pub mod cases;
pub mod check;
pub mod client;
pub mod dev;
pub mod error;
pub mod lang;
pub mod project;
pub mod scaffold;
pub mod sdk;
mod wasi_shim;

pub use build::{BuildOptions, Built, build};
pub use error::CliError;
pub use lang::Lang;
pub use project::{Manifest, Project};
pub use scaffold::{Template, new_project};
pub use sdk::Sdk;
