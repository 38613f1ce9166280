//! The `sluice` binary as a developer uses it: scaffold in every language,
//! build, check, and the errors a newcomer meets.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use std::path::Path;
use std::process::{Command, Output};

/// `sluice` in `dir`, with the SDK copy projects reference installed
/// under the test build's own data directory, not the user's.
fn sluice(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .current_dir(dir)
        .env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test"))
        .env_remove("SLUICE_SDK_ROOT")
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn workspace() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

#[test]
fn new_then_build_in_every_language() {
    let tmp = tempfile::tempdir().unwrap();
    let target = workspace().join("target/conformance-rust");
    for lang in ["rust", "c", "python", "js", "go"] {
        let name = format!("fw-{lang}");
        let o = sluice(tmp.path(), &["nf", "new", &name, "--lang", lang, "--template", "firewall"]);
        assert!(o.status.success(), "{}", text(&o));
        let project = tmp.path().join(&name);
        for f in ["sluice.toml", "README.md", "tests/basic/input.txt", "tests/basic/expected-verdicts.txt"] {
            assert!(project.join(f).is_file(), "{lang}: no {f}");
        }
        // One manifest: no second config file to keep in step.
        assert!(!project.join("host.toml").exists());
        let o = sluice(&project, &["nf", "build", "--cargo-target-dir", target.to_str().unwrap()]);
        assert!(o.status.success(), "{lang}: {}", text(&o));
        let contract = if matches!(lang, "python" | "js") { "sluice:nf@0.7.0" } else { "sluice:nf@0.6.0" };
        assert!(text(&o).contains(contract), "{lang}: {}", text(&o));
        // The template's own test case holds in every language.
        let o = sluice(&project, &["nf", "test", "--cargo-target-dir", target.to_str().unwrap()]);
        assert!(o.status.success() && text(&o).contains("case basic ... ok (8 packets)"), "{lang}: {}", text(&o));
        let component = project.join("build").join(format!("{name}.wasm"));
        let o = sluice(tmp.path(), &["nf", "check", component.to_str().unwrap()]);
        assert!(o.status.success() && text(&o).contains(": ok"), "{}", text(&o));
    }
}

#[test]
fn scaffolding_refuses_bad_names_templates_and_overwrites() {
    let tmp = tempfile::tempdir().unwrap();
    let o = sluice(tmp.path(), &["nf", "new", "Bad_Name", "--lang", "c"]);
    assert!(!o.status.success() && text(&o).contains("bad NF name"), "{}", text(&o));
    let o = sluice(tmp.path(), &["nf", "new", "x", "--lang", "cobol"]);
    assert!(!o.status.success() && text(&o).contains("unknown language 'cobol'"), "{}", text(&o));
    let o = sluice(tmp.path(), &["nf", "new", "x", "--lang", "c", "--template", "nat"]);
    assert!(!o.status.success() && text(&o).contains("no template 'nat'"), "{}", text(&o));
    assert!(sluice(tmp.path(), &["nf", "new", "x", "--lang", "c"]).status.success());
    let o = sluice(tmp.path(), &["nf", "new", "x", "--lang", "python"]);
    assert!(!o.status.success() && text(&o).contains("already exists"), "{}", text(&o));
}

#[test]
fn build_errors_say_what_and_where() {
    let tmp = tempfile::tempdir().unwrap();
    // Not a project.
    let o = sluice(tmp.path(), &["nf", "build"]);
    assert!(!o.status.success() && text(&o).contains("sluice.toml"), "{}", text(&o));
    // A C compile error reaches the user with the compiler's message.
    assert!(sluice(tmp.path(), &["nf", "new", "broken", "--lang", "c"]).status.success());
    let project = tmp.path().join("broken");
    std::fs::write(project.join("nf.c"), "#include <sluice_nf.h>\nint nf_init(void) { return undeclared; }\n").unwrap();
    let o = sluice(&project, &["nf", "build"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("clang failed") && text(&o).contains("undeclared"), "{}", text(&o));
    // A Python NF whose module does not export the interface fails the build.
    assert!(sluice(tmp.path(), &["nf", "new", "empty", "--lang", "python"]).status.success());
    let project = tmp.path().join("empty");
    std::fs::write(project.join("nf.py"), "x = 1\n").unwrap();
    let o = sluice(&project, &["nf", "build"]);
    assert!(!o.status.success() && text(&o).contains("componentize-py failed"), "{}", text(&o));
    // A Python syntax error is the compiler's own report, first and alone,
    // naming the project's file.
    std::fs::write(project.join("nf.py"), "x = 1\ny = (\n").unwrap();
    let o = sluice(&project, &["nf", "build"]);
    let said = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!o.status.success(), "{said}");
    let error = said.lines().skip_while(|l| !l.starts_with("error:")).collect::<Vec<_>>().join("\n");
    assert!(error.contains(&format!("File \"{}/nf.py\", line 2", project.canonicalize().unwrap().display())), "{said}");
    assert!(error.lines().last().is_some_and(|l| l.starts_with("SyntaxError: '(' was never closed")), "{said}");
    assert!(!error.contains("AssertionError") && !error.contains("Traceback"), "{said}");
}

/// What can be known without a build is said before one: no API key, a
/// missing input, no such test case, a bad `[run]`.
#[test]
fn checks_come_before_the_build() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(sluice(tmp.path(), &["nf", "new", "early", "--lang", "c"]).status.success());
    let project = tmp.path().join("early");
    let built = project.join("build");
    let mut no_key = Command::new(env!("CARGO_BIN_EXE_sluice"));
    no_key.args(["nf", "deploy"]).current_dir(&project).env_remove("SLUICE_API_KEY");
    let o = no_key.env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test")).output().unwrap();
    assert!(!o.status.success() && text(&o).contains("no API key"), "{}", text(&o));
    let o = sluice(&project, &["nf", "run", "--in", "nope.pcap"]);
    assert!(!o.status.success(), "{}", text(&o));
    assert_eq!(text(&o).matches("No such file or directory").count(), 1, "{}", text(&o));
    assert!(text(&o).contains("reading nope.pcap"), "{}", text(&o));
    let o = sluice(&project, &["nf", "test", "--case", "nope"]);
    assert!(!o.status.success() && text(&o).contains("no test case 'nope'"), "{}", text(&o));
    assert!(!built.exists(), "a build ran");
    let manifest = std::fs::read_to_string(project.join("sluice.toml")).unwrap();
    std::fs::write(project.join("sluice.toml"), manifest.replace("# workers = 1", "workers = 65")).unwrap();
    let o = sluice(&project, &["nf", "build"]);
    assert!(!o.status.success() && text(&o).contains("[run]: workers = 65 is out of range: 1 to 64"), "{}", text(&o));
}

/// A build whose sources, SDK and toolchain are those of the last one
/// keeps its component (Python's, whose bytes differ on every toolchain
/// run, included); a changed source builds again.
#[test]
fn an_unchanged_project_keeps_its_component() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(sluice(tmp.path(), &["nf", "new", "same", "--lang", "python"]).status.success());
    let project = tmp.path().join("same");
    let component = project.join("build/same.wasm");
    assert!(sluice(&project, &["nf", "build"]).status.success());
    let first = std::fs::read(&component).unwrap();
    let o = sluice(&project, &["nf", "test"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read(&component).unwrap(), first, "an unchanged project was built again");
    let source = std::fs::read_to_string(project.join("nf.py")).unwrap();
    std::fs::write(project.join("nf.py"), format!("{source}\n# a comment\n")).unwrap();
    assert!(sluice(&project, &["nf", "build"]).status.success());
    assert_ne!(std::fs::read(&component).unwrap(), first, "a changed source kept the old component");
}

/// `[run]` in sluice.toml and `--workers`/`--batch` shape `nf run` and
/// `nf test` (the report says so).
#[test]
fn local_runs_take_workers_and_batch_from_the_manifest_or_the_flags() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(sluice(tmp.path(), &["nf", "new", "shaped", "--lang", "c", "--template", "firewall"]).status.success());
    let project = tmp.path().join("shaped");
    let manifest = std::fs::read_to_string(project.join("sluice.toml")).unwrap();
    let manifest = manifest.replace("# workers = 1", "workers = 2").replace("# batch = 32", "batch = 4");
    std::fs::write(project.join("sluice.toml"), manifest).unwrap();
    let input = project.join("tests/basic/input.txt");
    let report = |args: &[&str]| -> serde_json::Value {
        let mut all = vec!["nf", "run", "--in", input.to_str().unwrap(), "--output", "json"];
        all.extend_from_slice(args);
        let o = sluice(&project, &all);
        assert!(o.status.success(), "{}", text(&o));
        serde_json::from_slice(&o.stdout).unwrap()
    };
    let r = report(&[]);
    assert_eq!((r["workers"].as_u64(), r["batch_size"].as_u64()), (Some(2), Some(4)), "{r}");
    let r = report(&["--workers", "1", "--batch", "2"]);
    assert_eq!((r["workers"].as_u64(), r["batch_size"].as_u64()), (Some(1), Some(2)), "{r}");
    let o = sluice(&project, &["nf", "test", "--workers", "3", "--batch", "1"]);
    assert!(o.status.success() && text(&o).contains("case basic ... ok"), "{}", text(&o));
}

/// The gateway flags appear in the help of the commands that use them
/// only; they are still accepted everywhere.
#[test]
fn help_shows_the_flags_a_command_uses() {
    let tmp = tempfile::tempdir().unwrap();
    let help = |args: &[&str]| text(&sluice(tmp.path(), args));
    let new = help(&["nf", "new", "--help"]);
    assert!(!new.contains("--api-key") && !new.contains("--admin-token") && !new.contains("--url"), "{new}");
    let create = help(&["tenant", "create", "--help"]);
    assert!(create.contains("--admin-token") && !create.contains("--api-key"), "{create}");
    let deploy = help(&["nf", "deploy", "--help"]);
    assert!(deploy.contains("--api-key") && !deploy.contains("--admin-token"), "{deploy}");
    let o = sluice(tmp.path(), &["sdk", "path", "--api-key", "x", "--url", "http://127.0.0.1:1"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn check_rejects_what_the_gateway_rejects() {
    let tmp = tempfile::tempdir().unwrap();
    let junk = tmp.path().join("junk.wasm");
    std::fs::write(&junk, b"definitely not wasm").unwrap();
    let o = sluice(tmp.path(), &["nf", "check", junk.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("not a WebAssembly binary"), "{}", text(&o));
    // Said once, with what to do.
    assert_eq!(text(&o).matches("not a WebAssembly binary").count(), 1, "{}", text(&o));
    assert!(text(&o).contains("sluice nf build"), "{}", text(&o));
    let core = tmp.path().join("core.wasm");
    std::fs::write(&core, b"\0asm\x01\0\0\0").unwrap();
    let o = sluice(tmp.path(), &["nf", "check", core.to_str().unwrap()]);
    assert!(!o.status.success() && text(&o).contains("core WebAssembly module"), "{}", text(&o));
    let wrong = workspace().join("target/nfs-test/wrong-world.wasm");
    if wrong.exists() {
        let o = sluice(tmp.path(), &["nf", "check", wrong.to_str().unwrap()]);
        assert!(!o.status.success() && text(&o).contains("exports none of"), "{}", text(&o));
    }
}

/// A reader that went away (`sluice … | head`) ends the command quietly.
#[test]
fn a_closed_pipe_ends_a_command_quietly() {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["sdk", "path"])
        .env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test"))
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let o = child.wait_with_output().unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success() && !err.contains("panicked"), "{:?}: {err}", o.status);
}

/// `nf test` shows what differs as a diff and fails; `--bless` records the
/// run; a case without expected files says how to make them.
#[test]
fn nf_test_diffs_blesses_and_explains() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(sluice(tmp.path(), &["nf", "new", "guard", "--lang", "c", "--template", "firewall"]).status.success());
    let project = tmp.path().join("guard");
    let verdicts = project.join("tests/basic/expected-verdicts.txt");
    let good = std::fs::read_to_string(&verdicts).unwrap();
    std::fs::write(&verdicts, good.replace("4 drop", "4 forward 0")).unwrap();
    let o = sluice(&project, &["nf", "test"]);
    assert!(!o.status.success(), "{}", text(&o));
    let t = text(&o);
    assert!(t.contains("case basic ... FAILED") && t.contains("-4 forward 0") && t.contains("+4 drop"), "{t}");
    assert!(!t.contains("-1 forward 0"), "only the differing lines and their context: {t}");
    // --bless writes the expected files from the run; then it passes.
    let o = sluice(&project, &["nf", "test", "--bless"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(std::fs::read_to_string(&verdicts).unwrap(), good);
    for f in ["expected.pcap", "expected.json"] {
        assert!(project.join("tests/basic").join(f).is_file());
    }
    let o = sluice(&project, &["nf", "test", "--output", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["failed"], 0);
    assert_eq!(v["cases"][0]["packets"], 8);
    // A case with no expected files, and one whose input does not parse.
    std::fs::create_dir_all(project.join("tests/empty")).unwrap();
    std::fs::write(project.join("tests/empty/config.txt"), "inside=10.0.0.0/8").unwrap();
    std::fs::write(project.join("tests/empty/input.txt"), "0 udp 10.0.0.1:1 > 10.0.0.2:2\n").unwrap();
    let o = sluice(&project, &["nf", "test", "--case", "empty"]);
    assert!(!o.status.success() && text(&o).contains("--bless"), "{}", text(&o));
    std::fs::write(project.join("tests/empty/input.txt"), "0 udp 10.0.0.1 > 10.0.0.2:2\n").unwrap();
    let o = sluice(&project, &["nf", "test", "--case", "empty"]);
    assert!(!o.status.success() && text(&o).contains("input.txt: line 1"), "{}", text(&o));
}

#[test]
fn nf_run_shows_the_nf_s_log_lines_and_why_a_batch_was_refused() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(sluice(tmp.path(), &["nf", "new", "loud", "--lang", "python"]).status.success());
    let project = tmp.path().join("loud");
    std::fs::write(
        project.join("nf.py"),
        "from sluice_nf import Level, export, log, stateless\n\n\n\
         class Loud:\n    def init(self, config):\n        return stateless()\n\n\
         \x20   def process(self, batch):\n        log(Level.INFO, f\"a batch of {len(batch)}\")\n\
         \x20       raise ValueError(\"not today\")\n\n\nNf = export(Loud)\n",
    )
    .unwrap();
    let o = sluice(&project, &["nf", "run", "--in", "tests/basic/input.txt"]);
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("a batch of 5"), "the NF's own line: {err}");
    assert!(err.contains("batch refused by the NF: ValueError: not today"), "why: {err}");
    // Quiet when asked.
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["nf", "run", "--in", "tests/basic/input.txt"])
        .current_dir(&project)
        .env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test"))
        .env("SLUICE_LOG", "error")
        .output()
        .unwrap();
    assert!(o.status.success() && !String::from_utf8_lossy(&o.stderr).contains("not today"), "{}", text(&o));
}

/// Polls `f` every 200 ms until it holds; fails after `secs`.
fn wait_until(secs: u64, what: &str, f: &mut dyn FnMut() -> bool) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !f() {
        assert!(std::time::Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}

/// A child process, killed when dropped (also when a test panics).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-TERM", &self.0.id().to_string()]).status();
        let _ = self.0.wait();
    }
}

/// A free TCP port on 127.0.0.1 that no earlier call in this process
/// returned (two binds in a row may get the same free port).
fn free_port() -> u16 {
    static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    loop {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        if GIVEN.lock().unwrap().insert(port) {
            return port;
        }
    }
}

/// A `sluice dev` on a free port with a tenant: the process, its URL and
/// the tenant's API key.
fn dev_with_tenant(dir: &Path) -> (Killed, String, String) {
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let dev = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--data"])
        .arg(dir.join("dev"))
        .env("SLUICE_ADMIN_TOKEN", "test-admin")
        .env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test"))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let dev = Killed(dev);
    wait_until(60, "sluice dev", &mut || ureq::get(&format!("{url}/healthz")).call().is_ok());
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["tenant", "create", "author", "--key-only"])
        .env("SLUICE_URL", &url)
        .env("SLUICE_ADMIN_TOKEN", "test-admin")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let key = String::from_utf8(o.stdout).unwrap().trim().to_string();
    (dev, url, key)
}

/// `sluice dev --metrics-listen` serves what a Prometheus would scrape,
/// and keeps its data out of the directory it was started from.
#[test]
fn dev_serves_metrics_and_keeps_its_data_in_the_data_directory() {
    let tmp = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics = free_port();
    let data_dir = tmp.path().join("data");
    let dev = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--metrics-listen", &format!("127.0.0.1:{metrics}")])
        .current_dir(tmp.path())
        .env("SLUICE_DATA_DIR", &data_dir)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let _dev = Killed(dev);
    let url = format!("http://127.0.0.1:{port}");
    wait_until(60, "sluice dev", &mut || ureq::get(&format!("{url}/healthz")).call().is_ok());
    // The admin token is read from the dev data directory.
    let o = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["tenant", "create", "metered", "--key-only", "--url", &url])
        .env("SLUICE_DATA_DIR", &data_dir)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(data_dir.join("dev/admin-token").is_file());
    let entries: Vec<_> = std::fs::read_dir(tmp.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(entries, vec![std::ffi::OsString::from("data")], "sluice dev wrote into its working directory");
    let mut body = String::new();
    wait_until(30, "the host's metrics", &mut || {
        body = ureq::get(&format!("http://127.0.0.1:{metrics}/metrics"))
            .call()
            .ok()
            .and_then(|mut r| r.body_mut().read_to_string().ok())
            .unwrap_or_default();
        body.contains("sluice_") && body.contains("host=\"dev\"")
    });
    assert!(ureq::get(&format!("http://127.0.0.1:{metrics}/readyz")).call().is_ok());
}

/// `sluice` as the tenant of `url`.
fn tenant(dir: &Path, url: &str, key: &str, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(args)
        .current_dir(dir)
        .env("SLUICE_URL", url)
        .env("SLUICE_API_KEY", key)
        .env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test"))
        .env_remove("SLUICE_SDK_ROOT")
        .output()
        .unwrap()
}

/// One manifest for everything: `nf run` takes the configuration and
/// limits of sluice.toml; `nf deploy` uploads its version once and
/// creates, keeps or updates the deployment with the same settings under
/// the API's names.
#[test]
fn nf_run_and_nf_deploy_follow_the_manifest() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(sluice(tmp.path(), &["nf", "new", "guard", "--lang", "c", "--template", "firewall"]).status.success());
    let project = tmp.path().join("guard");
    let manifest = project.join("sluice.toml");
    let original = std::fs::read_to_string(&manifest).unwrap();
    assert!(original.contains("config = \"inside=10.0.0.0/8\"") && original.contains("[limits]"), "{original}");
    std::fs::write(
        tmp.path().join("traffic.txt"),
        "0.000 tcp 10.0.0.5:40000 > 93.184.216.34:80 flags S\n\
         0.001 tcp 93.184.216.34:80 > 10.0.0.5:40000 flags SA\n\
         0.002 tcp 198.51.100.7:5555 > 10.0.0.5:22 flags S\n",
    )
    .unwrap();
    let run = |extra: &[&str]| {
        let mut args = vec!["nf", "run", "--in", "../traffic.txt", "--out", "../out.pcap", "-o", "json"];
        args.extend_from_slice(extra);
        let o = sluice(&project, &args);
        assert!(o.status.success(), "{}", text(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        (r["packets_in"].as_u64().unwrap(), r["packets_out"].as_u64().unwrap())
    };
    // Inside is 10/8: the outside SYN is dropped.
    assert_eq!(run(&[]), (3, 2));
    assert!(tmp.path().join("out.pcap").is_file());
    // The manifest's configuration is what the NF gets: with nothing
    // inside, every packet is unasked-for.
    std::fs::write(&manifest, original.replace("inside=10.0.0.0/8", "inside=192.0.2.0/24")).unwrap();
    assert_eq!(run(&[]), (3, 0));
    std::fs::write(tmp.path().join("fw.conf"), "inside=0.0.0.0/0").unwrap();
    assert_eq!(run(&["--config-file", "../fw.conf"]), (3, 3), "--config-file stands for the manifest's config");
    // Limits take the API's names (kebab-case too); others are refused by name.
    std::fs::write(&manifest, original.replace("[limits]", "[limits]\nmemory-mb = 16\ndeadlin_ms = 5")).unwrap();
    let o = sluice(&project, &["nf", "run", "--in", "../traffic.txt"]);
    assert!(!o.status.success() && text(&o).contains("deadlin_ms"), "{}", text(&o));
    std::fs::write(&manifest, original.replace("[limits]", "[limits]\nmemory-mb = 16\nmax_flows = 64")).unwrap();
    assert_eq!(run(&[]), (3, 2));

    let (_dev, url, key) = dev_with_tenant(tmp.path());
    let o = tenant(&project, &url, &key, &["nf", "deploy"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("uploaded guard@0.1.0") && text(&o).contains("revision 1"), "{}", text(&o));
    let d = tenant(&project, &url, &key, &["deployments", "-o", "json"]);
    let d: serde_json::Value = serde_json::from_slice(&d.stdout).unwrap();
    let d = &d[0];
    assert_eq!(
        (d["name"].as_str(), d["group"].as_str(), d["status"].as_str()),
        (Some("guard"), Some("default"), Some("running"))
    );
    let nf = &d["nfs"][0];
    assert_eq!(nf["config"], "inside=10.0.0.0/8");
    let set: serde_json::Map<String, serde_json::Value> = nf["limits"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(_, v)| !v.is_null())
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    assert_eq!(
        serde_json::Value::Object(set),
        serde_json::json!({"failure_policy": "fail-closed", "memory_mb": 16, "max_flows": 64})
    );
    // Again, unchanged: the module is there with the same bytes, and the
    // deployment keeps its revision.
    let o = tenant(&project, &url, &key, &["nf", "deploy"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).contains("already on the gateway: guard@0.1.0") && text(&o).contains("revision 1"),
        "{}",
        text(&o)
    );
    // New code under the old version is refused with what to do.
    let source = project.join("nf.c");
    let changed = std::fs::read_to_string(&source).unwrap().replace("out of memory", "no memory for the flow");
    std::fs::write(&source, changed).unwrap();
    let o = tenant(&project, &url, &key, &["nf", "deploy"]);
    assert!(!o.status.success() && text(&o).contains("raise `version`"), "{}", text(&o));
    let m = std::fs::read_to_string(&manifest).unwrap().replace("version = \"0.1.0\"", "version = \"0.2.0\"");
    std::fs::write(&manifest, m).unwrap();
    let o = tenant(&project, &url, &key, &["nf", "deploy", "-o", "json"]);
    assert!(o.status.success(), "{}", text(&o));
    let d: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!((d["revision"].as_u64(), d["nfs"][0]["version"].as_str()), (Some(2), Some("0.2.0")), "{d}");
}

/// `nf watch` against a `sluice dev`: deploys the project, and on every
/// save rebuilds, uploads a new dev version and swaps the deployment to
/// it; a build error is shown with the compiler's message and the running
/// version stays.
#[test]
fn nf_watch_redeploys_on_save_and_reports_build_errors() {
    let tmp = tempfile::tempdir().unwrap();
    let (_dev, url, key) = dev_with_tenant(tmp.path());
    let wait = wait_until;
    assert!(sluice(tmp.path(), &["nf", "new", "w", "--lang", "c"]).status.success());
    let project = tmp.path().join("w");
    let log = tmp.path().join("watch.log");
    let mut watch = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["nf", "watch", "--interval-ms", "200"])
        .current_dir(&project)
        .env("SLUICE_URL", &url)
        .env("SLUICE_API_KEY", &key)
        .env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test"))
        .stdout(std::fs::File::create(&log).unwrap())
        .stderr(std::fs::File::create(tmp.path().join("watch.err")).unwrap())
        .spawn()
        .map(Killed)
        .unwrap();
    let said = || std::fs::read_to_string(tmp.path().join("watch.err")).unwrap_or_default();
    wait(120, "the first deployment", &mut || said().contains("revision 1 runs w@0.0.0-dev."));
    let source = project.join("nf.c");
    let good = std::fs::read_to_string(&source).unwrap();
    // A broken save: the compiler's message, and revision 1 keeps running.
    std::fs::write(&source, format!("{good}\nint broken(void) {{ return undeclared_name; }}\n")).unwrap();
    wait(60, "the build error", &mut || said().contains("build failed") && said().contains("undeclared_name"));
    // Fixed: a new dev version, swapped in; the one it replaced is deleted.
    std::fs::write(&source, format!("{good}\n/* saved again */\n")).unwrap();
    wait(120, "the second deployment", &mut || said().contains("revision 2 runs w@0.0.0-dev."));
    let modules = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["nf", "list", "--output", "json"])
        .env("SLUICE_URL", &url)
        .env("SLUICE_API_KEY", &key)
        .output()
        .unwrap();
    let list: serde_json::Value = serde_json::from_slice(&modules.stdout).unwrap();
    assert_eq!(list.as_array().unwrap().len(), 1, "{list}");
    // Ctrl-C: the watch says what it leaves deployed and how to go back.
    let running = list[0]["version"].as_str().unwrap().to_string();
    let _ = Command::new("kill").args(["-INT", &watch.0.id().to_string()]).status();
    let status = watch.0.wait().unwrap();
    assert!(!status.success());
    let said = said();
    assert!(said.contains(&format!("deployment w stays on w@{running}")), "{said}");
    assert!(said.contains("`sluice nf deploy` puts sluice.toml's version back"), "{said}");
}

/// `sluice dev --watch <project>`: the dev cluster and the watch in one
/// command, as the tenant `dev`, whose key it prints.
#[test]
fn dev_watch_runs_the_cluster_and_deploys_the_project() {
    let tmp = tempfile::tempdir().unwrap();
    assert!(sluice(tmp.path(), &["nf", "new", "dw", "--lang", "c"]).status.success());
    let port = free_port();
    let out = tmp.path().join("dev.out");
    let err = tmp.path().join("dev.err");
    let _dev = Command::new(env!("CARGO_BIN_EXE_sluice"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}"), "--watch", "dw", "--data"])
        .arg(tmp.path().join("dev"))
        .current_dir(tmp.path())
        .env("SLUICE_DATA_DIR", workspace().join("target/sluice-data-test"))
        .env_remove("SLUICE_SDK_ROOT")
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .map(Killed)
        .unwrap();
    let said = || std::fs::read_to_string(&err).unwrap_or_default();
    wait_until(120, "the watched project to run", &mut || said().contains("revision 1 runs dw@0.0.0-dev."));
    let printed = std::fs::read_to_string(&out).unwrap();
    let key = printed.lines().find_map(|l| l.strip_prefix("export SLUICE_API_KEY=")).unwrap().to_string();
    let url = format!("http://127.0.0.1:{port}");
    let d = tenant(tmp.path(), &url, &key, &["deployments", "-o", "json"]);
    let d: serde_json::Value = serde_json::from_slice(&d.stdout).unwrap();
    assert_eq!((d[0]["name"].as_str(), d[0]["status"].as_str()), (Some("dw"), Some("running")), "{d}");
}
