//! `--nats-creds` against a real `nats-server` in operator mode: the
//! operator, the system account, the Sluice account (with JetStream) and
//! the users of the gateway and of a host are JWTs signed with their own
//! nkeys, as `nsc` makes them, preloaded into the server's memory
//! resolver. The gateway and the host sign in with `.creds` files only (no
//! nkey flags, no client certificates): the host joins, runs a deployment
//! and its meter records are billed; a user the account never signed is
//! refused at connect.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use base64::Engine;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Command;

/// A JWT of `claims` (their `iss` is `signer`'s public key) signed by
/// `signer` with ed25519, as NATS decodes it.
fn jwt(signer: &nkeys::KeyPair, subject: &str, name: &str, nats: Value) -> String {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let header = b64.encode(json!({ "typ": "JWT", "alg": "ed25519-nkey" }).to_string());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let claims = json!({
        "jti": format!("T{}{}", now, subject.get(..20).unwrap_or(subject)),
        "iat": now,
        "iss": signer.public_key(),
        "sub": subject,
        "name": name,
        "nats": nats,
    });
    let body = b64.encode(claims.to_string());
    let signed = format!("{header}.{body}");
    let sig = b64.encode(signer.sign(signed.as_bytes()).unwrap());
    format!("{signed}.{sig}")
}

/// A user of `account`, written as a `.creds` file at `path`.
fn creds(account: &nkeys::KeyPair, name: &str, path: &Path) {
    let user = nkeys::KeyPair::new_user();
    let token = jwt(
        account,
        &user.public_key(),
        name,
        json!({ "type": "user", "version": 2, "pub": {}, "sub": {}, "subs": -1, "data": -1, "payload": -1 }),
    );
    let seed = user.seed().unwrap();
    std::fs::write(
        path,
        format!(
            "-----BEGIN NATS USER JWT-----\n{token}\n------END NATS USER JWT------\n\n\
             ************************* IMPORTANT *************************\n\
             NKEY Seed printed below can be used to sign and prove identity.\n\n\
             -----BEGIN USER NKEY SEED-----\n{seed}\n------END USER NKEY SEED------\n"
        ),
    )
    .unwrap();
}

/// An operator-mode server: its URL, the account's key (to sign users)
/// and the process.
fn operator_server(dir: &Path) -> (String, nkeys::KeyPair, Proc) {
    let operator = nkeys::KeyPair::new_operator();
    let system = nkeys::KeyPair::new_account();
    let sluice = nkeys::KeyPair::new_account();
    let op = jwt(
        &operator,
        &operator.public_key(),
        "op",
        json!({ "type": "operator", "version": 2, "system_account": system.public_key() }),
    );
    let unlimited = json!({ "subs": -1, "data": -1, "payload": -1, "imports": -1, "exports": -1,
        "wildcards": true, "conn": -1, "leaf": -1 });
    let mut with_js = unlimited.clone();
    for k in ["mem_storage", "disk_storage", "streams", "consumer"] {
        with_js[k] = json!(-1);
    }
    let sys_jwt =
        jwt(&operator, &system.public_key(), "SYS", json!({ "type": "account", "version": 2, "limits": unlimited }));
    let acc_jwt =
        jwt(&operator, &sluice.public_key(), "sluice", json!({ "type": "account", "version": 2, "limits": with_js }));
    let port = free_port();
    let conf = dir.join("operator.conf");
    std::fs::write(
        &conf,
        format!(
            "operator: \"{op}\"\nsystem_account: {}\nresolver: MEMORY\nresolver_preload: {{\n  {}: \"{sys_jwt}\"\n  {}: \"{acc_jwt}\"\n}}\n\
             jetstream {{ store_dir: \"{}\" }}\n",
            system.public_key(),
            system.public_key(),
            sluice.public_key(),
            dir.join("js").display()
        ),
    )
    .unwrap();
    let child = Command::new(nats_server_bin())
        .arg("-c")
        .arg(&conf)
        .args(["-a", "127.0.0.1", "-p", &port.to_string()])
        .stdout(log_file(dir, "nats"))
        .stderr(log_file(dir, "nats"))
        .spawn()
        .unwrap();
    let proc = Proc { child, name: "nats-server (operator mode)".into() };
    wait_port(port, "nats-server");
    (format!("nats://127.0.0.1:{port}"), sluice, proc)
}

#[test]
fn gateway_and_host_sign_in_with_creds_files_on_an_operator_mode_server() {
    let _turn = beside_others();
    let dir = test_dir();
    let d = dir.path();
    let (url, account, _nats) = operator_server(d);
    let (gw_creds, host_creds): (PathBuf, PathBuf) = (d.join("gateway.creds"), d.join("h1.creds"));
    creds(&account, "gateway", &gw_creds);
    creds(&account, "h1", &host_creds);

    // A user signed by another account is refused at connect.
    let stranger = d.join("stranger.creds");
    creds(&nkeys::KeyPair::new_account(), "stranger", &stranger);
    let rt = tokio::runtime::Runtime::new().unwrap();
    let refused = rt.block_on(async {
        async_nats::ConnectOptions::with_credentials_file(stranger.clone()).await.unwrap().connect(url.as_str()).await
    });
    assert!(refused.is_err(), "a user no account of the server signed got in");

    let port = free_port();
    let mut gw = Gateway {
        url: format!("http://127.0.0.1:{port}"),
        port,
        data: d.join("gateway"),
        nats: url.clone(),
        log_dir: d.to_path_buf(),
        env: vec![("SLUICE_NATS_CREDS".into(), gw_creds.to_str().unwrap().into())],
        proc: None,
    };
    gw.restart();
    let api = gw.api();
    let r = api.post(Some(ADMIN), "/v1/hosts", &json!({ "id": "h1", "group": "default" }));
    assert_eq!(r.status, 201, "{}", r.body);
    let (_, key) = api.tenant("acme");
    assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let dep = api.post(Some(&key), "/v1/deployments", &json!({ "name": "c", "module": "counter@1" }));
    assert_eq!(dep.status, 201, "{}", dep.body);

    let pcap = trace(d, 100);
    let report = d.join("h1.json");
    let replay = Replay { pcap: &pcap, loops: 2, pps: 5000, window_ms: 200, report: &report };
    let child = Command::new(sibling_bin("sluice-host"))
        .args(["serve", "--nats", &url, "--cluster", "test", "--host-id", "h1", "--nats-creds"])
        .arg(&host_creds)
        .arg("--state-dir")
        .arg(d.join("state-h1"))
        .args(replay.args())
        .env("SLUICE_LOG", "info")
        .env("SLUICE_CACHE_DIR", workspace().join("target/sluice-cache"))
        .stdout(log_file(d, "h1"))
        .stderr(log_file(d, "h1"))
        .spawn()
        .unwrap();
    let mut host = Proc { child, name: "sluice-host h1 (creds)".into() };
    api.wait_running(&key, "c", 1);
    wait_for(60, "h1's passes", || (host_report(&report)["traces"].as_u64() == Some(2)).then_some(()));
    host.term();
    let expected = report_totals(&[host_report(&report)]);
    assert!(expected.values().map(|t| t[1]).sum::<u64>() > 0, "{expected:?}");
    wait_for(30, "usage to equal h1's report", || {
        let u = api.get(Some(&key), "/v1/usage").body;
        (usage_totals(&u) == expected).then_some(())
    });
}
