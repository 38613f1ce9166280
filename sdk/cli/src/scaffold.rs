//! `sluice nf new`: a buildable project from a template.
//!
//! The templates are the `counter` and `firewall` cases of the conformance
//! suite (`tests/conformance/`), so every template in every language is
//! built and checked byte for byte against the others by `make test`.

use crate::Lang;
use crate::error::{CliError, io};
use crate::project::{MANIFEST, Manifest, check_name};
use crate::sdk::Sdk;
use std::path::{Path, PathBuf};

/// A starting point for a new NF.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Template {
    /// Forwards everything and counts packets and bytes in a host table.
    Counter,
    /// Lets connections from inside out and their replies back in; drops
    /// the rest. Keeps per-flow state.
    Firewall,
}

impl std::str::FromStr for Template {
    type Err = CliError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "counter" => Ok(Template::Counter),
            "firewall" => Ok(Template::Firewall),
            other => Err(CliError::UnknownTemplate(other.to_string())),
        }
    }
}

impl Template {
    fn name(self) -> &'static str {
        match self {
            Template::Counter => "counter",
            Template::Firewall => "firewall",
        }
    }

    /// The NF source of this template in `lang`.
    pub fn source(self, lang: Lang) -> &'static str {
        macro_rules! case {
            ($case:literal) => {
                match lang {
                    Lang::Rust => include_str!(concat!("../../../tests/conformance/", $case, "/nf.rs")),
                    Lang::C => include_str!(concat!("../../../tests/conformance/", $case, "/nf.c")),
                    Lang::Python => include_str!(concat!("../../../tests/conformance/", $case, "/nf.py")),
                    Lang::Js => include_str!(concat!("../../../tests/conformance/", $case, "/nf.js")),
                    Lang::Go => include_str!(concat!("../../../tests/conformance/", $case, "/nf.go")),
                }
            };
        }
        match self {
            Template::Counter => case!("counter"),
            Template::Firewall => case!("firewall"),
        }
    }

    /// The test case `sluice nf new` writes (`tests/basic/`): its input,
    /// one packet per line, and what must become of each packet.
    pub fn test_case(self) -> (&'static str, &'static str) {
        match self {
            Template::Counter => (
                "# Every packet passes and is counted.\n\
                 0.000 tcp 10.0.0.5:40000 > 93.184.216.34:80 flags S\n\
                 0.001 tcp 93.184.216.34:80 > 10.0.0.5:40000 flags SA\n\
                 0.002 udp 10.0.0.5:5353 > 8.8.8.8:53 payload \"query\"\n\
                 0.003 icmp 10.0.0.5 > 10.0.0.9 ttl 1\n\
                 0.004 vlan 100 tcp [2001:db8::1]:443 > [2001:db8::2]:5555 flags R\n",
                "1 forward 0\n2 forward 0\n3 forward 0\n4 forward 0\n5 forward 0\n",
            ),
            Template::Firewall => (
                "# An inside host opens a connection; the replies come back in.\n\
                 0.000 tcp 10.0.0.5:40000 > 93.184.216.34:80 flags S\n\
                 0.001 tcp 93.184.216.34:80 > 10.0.0.5:40000 flags SA\n\
                 0.002 tcp 10.0.0.5:40000 > 93.184.216.34:80 flags A\n\
                 # Nobody inside asked for this one.\n\
                 0.003 tcp 198.51.100.7:5555 > 10.0.0.5:22 flags S\n\
                 # A scan from outside, three ports.\n\
                 0.004 tcp 198.51.100.7:50000 > 10.0.0.9:* flags S repeat 3\n\
                 # Hosts on the link find each other: ARP passes.\n\
                 0.005 arp 10.0.0.5 > 10.0.0.1\n",
                "1 forward 0\n2 forward 0\n3 forward 0\n4 drop\n5 drop\n6 drop\n7 drop\n8 forward 0\n",
            ),
        }
    }

    /// The NF configuration the template expects (`config` in
    /// `sluice.toml`).
    pub fn config(self) -> &'static str {
        match self {
            Template::Counter => "",
            Template::Firewall => "inside=10.0.0.0/8",
        }
    }
}

/// Creates `<parent>/<name>/`: the manifest, the NF source, a test case
/// and a README saying how to build, test, run and deploy it.
/// Returns the project directory.
pub fn new_project(sdk: &Sdk, parent: &Path, name: &str, lang: Lang, template: Template) -> Result<PathBuf, CliError> {
    check_name(name)?;
    let dir = parent.join(name);
    if dir.exists() {
        return Err(CliError::Exists(dir));
    }
    write_sources(sdk, &dir, name, lang, template.source(lang))?;
    write(&dir.join(MANIFEST), &manifest_text(name, lang, template))?;
    // A test case to start from: `sluice nf test` runs it.
    let (input, verdicts) = template.test_case();
    let case = dir.join("tests").join("basic");
    write(&case.join("input.txt"), input)?;
    write(&case.join("expected-verdicts.txt"), verdicts)?;
    let readme = format!(
        "# {name}\n\nA Sluice network function in {lang}, from the `{template}` template.\n\n\
         ```sh\nsluice nf build            # -> build/{name}.wasm, checked against sluice:nf@{v}\n\
         sluice nf test             # build, then run tests/*/ (input.txt, expected-verdicts.txt, ...)\n\
         sluice-host synth --out trace.pcap --sessions 1000\n\
         sluice nf run --in trace.pcap --out out.pcap   # build, run locally, print the report\n\
         sluice nf deploy           # upload {name}@<version> and create or update its deployment\n\
         sluice nf watch            # rebuild, upload and hot-swap on every save\n```\n\n\
         `sluice.toml` holds what the NF needs everywhere: its version, its configuration \
         (`[config]`), its limits (`[limits]`, the names of the gateway's deployment API) and \
         where it is deployed (`[deployment]`: name, group, attach). The SDK's README \
         ({link}/sdk/{lang_dir}/README.md) describes the API.\n\n\
         ## Tests\n\n\
         Each folder under `tests/` is a case: `input.txt` (one packet per line: time, \
         optional `vlan N`, protocol, `source > destination`, then `flags`, `ttl`, \
         `payload \"text\"`, `len`, `repeat N every S`; `*` counts ports and octets in \
         repeats) or `input.pcap`, `config.txt` if the case needs another configuration than \
         `sluice.toml`'s, and the expected files: \
         `expected-verdicts.txt` (one line per packet: `3 forward 0`, `4 drop`), \
         `expected.pcap` and `expected.json` (meters, events, tables). \
         `sluice nf test --bless` writes them from a run; review them before you commit.\n",
        template = template.name(),
        v = crate::sdk::contract_version(lang),
        link = crate::sdk::PROJECT_SDK_LINK,
        lang_dir = lang.name(),
    );
    write(&dir.join("README.md"), &readme)?;
    sdk.link_into(&dir)?;
    Ok(dir)
}

/// A new project's `sluice.toml`, with the settings it may take shown.
fn manifest_text(name: &str, lang: Lang, template: Template) -> String {
    // The interpreters inside Python and JavaScript components take
    // microseconds per packet, so their batches get a longer leash than
    // the host's 10 ms default.
    let deadline = match lang {
        Lang::Python | Lang::Js => "deadline_ms = 100\n",
        Lang::Rust | Lang::C | Lang::Go => "# deadline_ms = 10\n",
    };
    let config = match template.config() {
        "" => {
            "# config = \"...\"                # handed to init as written; a [config] table goes as JSON\n".to_string()
        }
        c => format!("config = {}\n", toml::Value::String(c.to_string())),
    };
    format!(
        "# The NF project: `sluice nf build|test|run|deploy|watch` read this file.\n\
         name = \"{name}\"\n\
         lang = \"{lang}\"\n\
         # The version `sluice nf deploy` uploads; a gateway keeps each version's\n\
         # bytes for good, so change it with the code.\n\
         version = \"0.1.0\"\n\
         {config}\n\
         # Limits: the names, units and ranges of the gateway's deployment API;\n\
         # unset ones take the host's defaults.\n\
         [limits]\n\
         failure_policy = \"fail-closed\"   # or fail-open\n\
         {deadline}\
         # memory_mb = 64\n\
         # state_budget_mb = 64\n\
         # max_flows = 1048576\n\
         # log_lines_per_second = 50\n\n\
         # Where `sluice nf deploy` and `sluice nf watch` deploy it.\n\
         [deployment]\n\
         # name = \"{name}\"\n\
         group = \"default\"\n\
         # attach = [\"port=0,vlan=100\"]    # in a group whose operator exposes ports\n\n\
         # How `sluice nf run` and `sluice nf test` run it here (--workers, --batch, --spread).\n\
         [run]\n\
         # workers = 1\n\
         # batch = 32\n\
         # spread = \"flow\"             # or \"addresses\": every connection between two hosts on one worker\n",
        lang = lang.name(),
    )
}

/// Writes a project's manifest and language files around `source` (used
/// by `new` and by the conformance harness for each case's sources).
pub fn write_sources(sdk: &Sdk, dir: &Path, name: &str, lang: Lang, source: &str) -> Result<(), CliError> {
    check_name(name)?;
    let manifest = Manifest::new(name, lang);
    let text = toml::to_string(&manifest)
        .map_err(|e| CliError::Manifest { path: dir.join(MANIFEST), reason: e.to_string() })?;
    write(&dir.join(MANIFEST), &text)?;
    write(&dir.join(lang.main_source()), source)?;
    match lang {
        Lang::Rust => {
            let cargo = format!(
                "[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n\n[lib]\ncrate-type = [\"cdylib\"]\npath = \"src/lib.rs\"\n\n\
                 # The Rust SDK, through the link `sluice` keeps to its installed copy.\n\
                 [dependencies]\nsluice-sdk = {{ path = \"{link}/sdk/rust\" }}\n\n\
                 [profile.release]\nopt-level = 3\nlto = true\ncodegen-units = 1\nstrip = true\n\n\
                 # A project of its own, even inside another workspace.\n[workspace]\n",
                link = crate::sdk::PROJECT_SDK_LINK
            );
            write(&dir.join("Cargo.toml"), &cargo)?;
            // Start from the versions the SDK is built and tested with
            // (cargo drops what the project does not use), so a build
            // needs no registry lookup and matches the host's.
            let installed = sdk.lang_dir(Lang::Rust).join("Cargo.lock");
            let lock = if installed.is_file() { installed } else { sdk.root().join("Cargo.lock") };
            if lock.is_file() {
                std::fs::copy(&lock, dir.join("Cargo.lock")).map_err(io("copying", &lock))?;
            }
            write(&dir.join(".gitignore"), &ignore(&["/target"]))?;
        }
        Lang::Js => {
            let jsconfig = format!(
                "{{\n  \"compilerOptions\": {{\n    \"checkJs\": true,\n    \"module\": \"es2022\",\n    \"target\": \"es2022\",\n    \"paths\": {{ \"@sluice/nf\": [\"./{}/sdk/js/src/index.d.ts\"] }}\n  }}\n}}\n",
                crate::sdk::PROJECT_SDK_LINK
            );
            write(&dir.join("jsconfig.json"), &jsconfig)?;
            write(&dir.join(".gitignore"), &ignore(&[]))?;
        }
        Lang::Go => {
            let gomod = format!(
                "module {name}\n\ngo 1.24\n\nrequire sluice.dev/nf v0.0.0\n\n// The Go SDK, through the link `sluice` keeps to its installed copy.\nreplace sluice.dev/nf => ./{}/sdk/go\n",
                crate::sdk::PROJECT_SDK_LINK
            );
            write(&dir.join("go.mod"), &gomod)?;
            write(&dir.join(".gitignore"), &ignore(&[]))?;
        }
        Lang::C => write(&dir.join(".gitignore"), &ignore(&[]))?,
        Lang::Python => write(&dir.join(".gitignore"), &ignore(&["__pycache__/"]))?,
    }
    Ok(())
}

/// A project's `.gitignore`: build outputs, the SDK link, and `more`.
fn ignore(more: &[&str]) -> String {
    ["/build", "/.sluice"].iter().chain(more).map(|l| format!("{l}\n")).collect()
}

fn write(path: &Path, text: &str) -> Result<(), CliError> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io("creating", parent))?;
    }
    std::fs::write(path, text).map_err(io("writing", path))
}
