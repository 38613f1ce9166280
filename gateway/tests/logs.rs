//! Structured logs: with `SLUICE_LOG_FORMAT=json` the gateway and a host
//! write one JSON object a line, each with its time, level, target and
//! fields; a log format or filter that is not one stops a binary at once
//! with the reason.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::Value;
use std::process::Command;

/// The log lines of `path` (the process's stderr and stdout) so far, each
/// read as JSON; the other lines are what the binary prints for people on
/// stdout ("listening on …"), never a log line in text.
fn json_lines(path: &std::path::Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let (json, other): (Vec<&str>, Vec<&str>) =
        text.lines().filter(|l| !l.trim().is_empty()).partition(|l| l.starts_with('{'));
    for l in other {
        let words: Vec<&str> = l.split_whitespace().collect();
        assert!(!["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].iter().any(|w| words.contains(w)), "a text log line: {l}");
    }
    json.iter().map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not a JSON log line ({e}): {l}"))).collect()
}

#[test]
fn json_logs_are_one_object_a_line_and_bad_settings_say_why() {
    let _turn = beside_others();
    let dir = test_dir();
    let d = dir.path();
    let nats = Nats::start(d);
    let json = [("SLUICE_LOG_FORMAT", "json")];
    let gw = Gateway::start(&nats, d, &json);
    let api = gw.api();
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let r = api.post(Some(&key), "/v1/deployments", &serde_json::json!({ "name": "c", "module": "counter@1" }));
    assert_eq!(r.status, 201, "{}", r.body);
    register_host(&nats, &gw, "h1", "default");
    let child = host_command(&nats, d, "h1", &[]).env("SLUICE_LOG_FORMAT", "json").spawn().unwrap();
    let mut host = Proc { child, name: "sluice-host h1".into() };
    api.wait_running(&key, "c", 1);
    host.term();
    drop(gw);

    for name in ["gateway", "h1"] {
        let lines = json_lines(&d.join(format!("{name}.log")));
        assert!(lines.len() >= 3, "{name}: {} lines", lines.len());
        for l in &lines {
            assert!(l["timestamp"].is_string() && l["level"].is_string() && l["target"].is_string(), "{name}: {l}");
            assert!(l["fields"].is_object(), "{name}: {l}");
        }
        eprintln!("{name}: {} JSON lines, e.g. {}", lines.len(), lines[lines.len() - 1]);
    }
    // The host said its deployment runs, with the deployment as a field.
    let host_lines = json_lines(&d.join("h1.log"));
    assert!(
        host_lines
            .iter()
            .any(|l| l["fields"]["message"] == "deployment running" && l["fields"]["deployment"].is_string()),
        "no `deployment running` line with its deployment"
    );

    // Not a format, not a filter: the binary stops before doing anything
    // (`--version` and `--help` need no logging and still answer).
    let nowhere = d.join("no-such-module.wasm");
    for (bin, var, value, says) in [
        ("sluice-host", "SLUICE_LOG_FORMAT", "xml", "SLUICE_LOG_FORMAT='xml'"),
        ("sluice-gateway", "SLUICE_LOG_FORMAT", "yaml", "use `text` or `json`"),
        ("sluice-host", "SLUICE_LOG", "info,[[[", "SLUICE_LOG='info,[[['"),
    ] {
        let args: Vec<&std::ffi::OsStr> = match bin {
            "sluice-host" => vec!["check".as_ref(), nowhere.as_os_str()],
            _ => vec!["nats-auth".as_ref()],
        };
        let out = Command::new(sibling_bin(bin)).args(&args).env(var, value).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bin} with {var}={value}: {err}");
        assert!(err.contains(says), "{bin} with {var}={value}: {err}");
    }
}
