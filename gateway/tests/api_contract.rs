//! The HTTP API against its own OpenAPI document: Schemathesis (from
//! PyPI, installed by `make setup`) generates requests from
//! `/openapi.json` of a real `sluice dev` and checks every answer: no
//! server error, every answer's status is one the document lists for its
//! operation, every answer matches the schema and content type the
//! document gives for that status, and every request the document admits
//! is accepted (`positive_data_acceptance`; where a schema-valid request
//! may be refused for what no schema can say, tests/schemathesis.toml
//! names the statuses and tests/schemathesis_hooks.py fixes requests up to
//! the rules the document states in words). Run once as a tenant (with
//! objects to find: a module and a deployment) and once as the operator.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use std::process::{Command, Stdio};

const ADMIN_TOKEN: &str = "contract-admin-token";

/// Runs Schemathesis against `url` with `token`, restricted by `filters`;
/// the report's text on failure.
fn schemathesis(dir: &std::path::Path, url: &str, token: &str, filters: &[&str], name: &str) {
    let report = dir.join(format!("{name}.txt"));
    let out = Command::new("schemathesis")
        .args(["--config-file", concat!(env!("CARGO_MANIFEST_DIR"), "/tests/schemathesis.toml")])
        .args(["run", &format!("{url}/openapi.json")])
        .args([
            "--checks",
            "not_a_server_error,response_schema_conformance,content_type_conformance,status_code_conformance,positive_data_acceptance",
        ])
        .args(["--phases", "examples,coverage,fuzzing"])
        // One worker: with a fixed seed, the same requests every run.
        .args(["--max-examples", "25", "--workers", "1", "--seed", "1"])
        .args(["--header", &format!("Authorization: Bearer {token}")])
        .args(filters)
        // Hooks: a serializer for application/wasm uploads, and what the
        // document cannot say (schemathesis_hooks.py).
        .env("SCHEMATHESIS_HOOKS", "schemathesis_hooks")
        .env("PYTHONPATH", concat!(env!("CARGO_MANIFEST_DIR"), "/tests"))
        // Its example database and reports go to the test's own folder.
        .current_dir(dir)
        .stdin(Stdio::null())
        .output()
        .expect("schemathesis is missing: run `make setup`");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    std::fs::write(&report, &text).unwrap();
    assert!(out.status.success(), "schemathesis ({name}) found problems:\n{text}");
    assert!(text.contains("passed"), "{text}");
}

#[test]
fn the_api_keeps_its_openapi_contract() {
    let _turn = beside_others();
    let dir = test_dir();
    let port = free_port();
    let url = format!("http://127.0.0.1:{port}");
    let log = std::fs::File::create(dir.path().join("dev.log")).unwrap();
    let child = Command::new(sibling_bin("sluice"))
        .args(["dev", "--listen", &format!("127.0.0.1:{port}")])
        .arg("--data")
        .arg(dir.path().join("dev"))
        .env("SLUICE_ADMIN_TOKEN", ADMIN_TOKEN)
        .stdout(Stdio::from(log.try_clone().unwrap()))
        .stderr(Stdio::from(log))
        .spawn()
        .unwrap();
    let _dev = Proc { child, name: "sluice dev".into() };
    wait_for(60, "sluice dev to answer", || ureq::get(format!("{url}/healthz")).call().ok());
    let api = Api { base: url.clone() };
    let t = api.post(Some(ADMIN_TOKEN), "/v1/tenants", &serde_json::json!({ "name": "contract" }));
    assert_eq!(t.status, 201, "{}", t.body);
    let key = t.body["api_key"].as_str().unwrap().to_string();
    let wasm = std::fs::read(nf("counter")).unwrap();
    assert_eq!(api.upload(Some(&key), "counter", "1.0.0", &wasm).status, 201);
    let d = api.post(Some(&key), "/v1/deployments", &serde_json::json!({ "name": "c", "module": "counter@1.0.0" }));
    assert_eq!(d.status, 201, "{}", d.body);

    // As the tenant: everything but what would end its own key.
    schemathesis(dir.path(), &url, &key, &["--exclude-path-regex", "^/v1/me/keys/(rotate|\\{prefix\\})$"], "tenant");
    // As the operator: tenants, hosts and groups.
    schemathesis(
        dir.path(),
        &url,
        ADMIN_TOKEN,
        &["--include-tag-regex", "^(tenants|hosts|groups)$", "--exclude-path-regex", "^/v1/me"],
        "operator",
    );
    // The gateway still serves after it (the runs may have deleted the
    // deployment, revoked the key and changed the tenant's groups, as the
    // API lets them): a new key of the tenant works, and a deployment can
    // be made again.
    assert_eq!(api.get(None, "/healthz").status, 200);
    let id = t.body["id"].as_str().unwrap();
    let fresh = api.post(Some(ADMIN_TOKEN), &format!("/v1/tenants/{id}/keys"), &serde_json::json!({}));
    assert_eq!(fresh.status, 201, "{}", fresh.body);
    let k = fresh.body["api_key"].as_str();
    // The operator's run may have changed the tenant's groups.
    let g =
        api.put(Some(ADMIN_TOKEN), &format!("/v1/tenants/{id}/groups"), &serde_json::json!({ "groups": ["default"] }));
    assert_eq!(g.status, 200, "{}", g.body);
    assert_eq!(api.get(k, "/v1/me").body["name"], "contract");
    if api.get(k, "/v1/modules/counter@1.0.0").status == 404 {
        assert_eq!(api.upload(k, "counter", "1.0.0", &wasm).status, 201);
    }
    let _ = api.delete(k, "/v1/deployments/again");
    let d = api.post(k, "/v1/deployments", &serde_json::json!({ "name": "again", "module": "counter@1.0.0" }));
    assert_eq!(d.status, 201, "{}", d.body);
}
