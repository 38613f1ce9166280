//! The Helm chart (deploy/helm/sluice) and its secrets script
//! (deploy/helm/make-secrets.sh): rendered by a real `helm` with the
//! default and the production values, validated against Kubernetes 1.33's
//! schemas by `kubernetes-validate --strict`; then what it renders run as
//! the kubelet would run it, without a cluster: the NATS server's rendered
//! configuration with the Secrets' certificates, the auth-sync init
//! container and sidecar with their rendered arguments, the gateway with
//! its rendered gateway.toml, and a host pod's container with its rendered
//! arguments and environment, on an af_packet interface, registered by the
//! script's register-hosts.sh.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use base64::Engine;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn helm() -> PathBuf {
    if let Ok(p) = std::env::var("SLUICE_HELM") {
        return PathBuf::from(p);
    }
    // `make setup` installs it with `go install`.
    let gopath = Command::new("go")
        .args(["env", "GOPATH"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let gobin = gopath.map(|g| Path::new(&g).join("bin")).unwrap_or_default();
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .chain([gobin])
        .map(|d| d.join("helm"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("helm not found: run `make setup` (it installs helm 3.22 with `go install`)"))
}

fn chart() -> PathBuf {
    workspace().join("deploy/helm/sluice")
}

fn ok(out: Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

/// `make-secrets.sh` into `out` for release `sluice` in namespace `sluice`.
fn make_secrets(out: &Path, extra: &[&str]) -> String {
    let bin = sibling_bin("sluice-host").parent().unwrap().to_path_buf();
    ok(
        Command::new("bash")
            .arg(workspace().join("deploy/helm/make-secrets.sh"))
            .arg(out)
            .args(["--release", "sluice", "--namespace", "sluice"])
            .args(extra)
            .env("SLUICE_BIN", bin)
            .output()
            .unwrap(),
        "make-secrets.sh",
    )
}

/// `helm template` of the chart as release `sluice` in namespace `sluice`.
fn template(args: &[&str]) -> Output {
    Command::new(helm())
        .args(["template", "sluice"])
        .arg(chart())
        .args(["--namespace", "sluice", "--kube-version", "1.33.0"])
        .args(args)
        .output()
        .unwrap()
}

/// The documents of a multi-document YAML text, as JSON.
fn documents(yaml: &str) -> Vec<Value> {
    let out = Command::new("python3")
        .args([
            "-c",
            "import sys, yaml, json; print(json.dumps([d for d in yaml.safe_load_all(sys.stdin) if d is not None]))",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut c| {
            use std::io::Write;
            c.stdin.take().unwrap().write_all(yaml.as_bytes())?;
            c.wait_with_output()
        })
        .unwrap();
    serde_json::from_slice(&ok(out, "python3 yaml").into_bytes()).unwrap()
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in the rendered chart"))
}

/// `kubernetes-validate --strict` against Kubernetes 1.33: every error
/// fails; a warning is allowed only for the Prometheus Operator's kinds,
/// whose schemas it does not hold.
fn validate(file: &Path) {
    let out = Command::new("kubernetes-validate")
        .args(["-k", "1.33.0", "--strict", "--quiet"])
        .arg(file)
        .output()
        .unwrap_or_else(|e| panic!("kubernetes-validate: {e}: run `make setup` (pip install kubernetes-validate)"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && !text.contains("ERROR"), "{}: {text}", file.display());
    for line in text.lines().filter(|l| l.contains("WARN")) {
        assert!(line.contains("ServiceMonitor") || line.contains("PrometheusRule"), "{line}");
    }
}

fn secret_data(docs: &[Value], name: &str) -> serde_json::Map<String, Value> {
    find(docs, "Secret", name)["data"].as_object().unwrap().clone()
}

fn decode(v: &Value) -> Vec<u8> {
    base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap()
}

#[test]
fn the_chart_renders_valid_kubernetes_objects_wired_to_its_secrets() {
    let _turn = beside_others();
    let dir = test_dir();
    let out = dir.path().join("secrets");
    make_secrets(&out, &["--group", "default=2", "--group", "edge=4", "--group", "lab=1"]);
    // What the script writes holds secrets: the operator's alone.
    use std::os::unix::fs::PermissionsExt;
    for f in ["secrets.yaml", "values-secrets.yaml", "register-hosts.sh", "pki/admin-token", "pki/gateway.nk"] {
        let mode = std::fs::metadata(out.join(f)).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode & 0o077, 0, "{f} is readable by others ({mode:o})");
    }
    validate(&out.join("secrets.yaml"));
    let secrets = documents(&std::fs::read_to_string(out.join("secrets.yaml")).unwrap());
    let values = out.join("values-secrets.yaml");
    let values = values.to_str().unwrap();
    let production = chart().join("values-production.yaml");

    for (name, extra) in [("default", vec![]), ("production", vec!["-f", production.to_str().unwrap()])] {
        let mut args = vec!["-f", values];
        args.extend(extra.iter().copied());
        let lint = Command::new(helm())
            .arg("lint")
            .arg(chart())
            .args(["--strict", "--kube-version", "1.33.0"])
            .args(&args)
            .output()
            .unwrap();
        ok(lint, &format!("helm lint ({name} values)"));
        let text = ok(template(&args), &format!("helm template ({name} values)"));
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(&file, &text).unwrap();
        validate(&file);
        let docs = documents(&text);

        // Every Secret and key a pod names is one the script wrote.
        for d in docs.iter().filter(|d| d["kind"] == "Deployment" || d["kind"] == "StatefulSet") {
            let spec = &d["spec"]["template"]["spec"];
            for v in spec["volumes"].as_array().unwrap().iter().filter(|v| v["secret"].is_object()) {
                let data = secret_data(&secrets, v["secret"]["secretName"].as_str().unwrap());
                for item in v["secret"]["items"].as_array().into_iter().flatten() {
                    assert!(data.contains_key(item["key"].as_str().unwrap()), "{}: {item}", d["metadata"]["name"]);
                }
            }
            let containers = spec["containers"]
                .as_array()
                .unwrap()
                .iter()
                .chain(spec["initContainers"].as_array().into_iter().flatten());
            for c in containers {
                for e in
                    c["env"].as_array().into_iter().flatten().filter(|e| e["valueFrom"]["secretKeyRef"].is_object())
                {
                    let r = &e["valueFrom"]["secretKeyRef"];
                    assert!(
                        secret_data(&secrets, r["name"].as_str().unwrap()).contains_key(r["key"].as_str().unwrap())
                    );
                }
                let sc = &c["securityContext"];
                assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{}", c["name"]);
                assert_eq!(sc["readOnlyRootFilesystem"], true, "{}", c["name"]);
                if !c["args"].as_array().is_some_and(|a| a.first().is_some_and(|s| s == "serve")) {
                    assert_eq!(sc["runAsNonRoot"], true, "{} runs as root", c["name"]);
                }
            }
        }
        // Each host pod finds its own credentials under its name.
        let default_hosts = secret_data(&secrets, "sluice-host-default");
        if name == "default" {
            let sts = find(&docs, "StatefulSet", "sluice-host-default");
            assert_eq!(sts["spec"]["replicas"], 2);
            for i in 0..2 {
                for suffix in [".nk", ".pem", "-key.pem"] {
                    assert!(default_hosts.contains_key(&format!("sluice-host-default-{i}{suffix}")));
                }
            }
            let c = &sts["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["securityContext"]["capabilities"]["add"], serde_json::json!(["NET_RAW"]));
            assert!(c["resources"]["limits"]["hugepages-2Mi"].is_null(), "af_packet needs no hugepages");
            assert!(c["args"].as_array().unwrap().iter().any(|a| a == "--vdev=net_af_packet0,iface=eth0"));
            // The dashboard and its scrape annotations.
            let dash = find(&docs, "ConfigMap", "sluice-dashboard");
            let shipped: Value =
                serde_json::from_slice(&std::fs::read(workspace().join("deploy/grafana/sluice.json")).unwrap())
                    .unwrap();
            let packed: Value = serde_json::from_str(dash["data"]["sluice.json"].as_str().unwrap()).unwrap();
            assert_eq!(packed, shipped);
            assert_eq!(dash["metadata"]["labels"]["grafana_dashboard"], "1");
            let gw = find(&docs, "Deployment", "sluice-gateway");
            assert_eq!(gw["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"], "9464");
            assert_eq!(gw["spec"]["strategy"]["type"], "Recreate");
            let nats = find(&docs, "StatefulSet", "sluice-nats");
            assert_eq!(nats["spec"]["replicas"], 3);
            let conf = find(&docs, "ConfigMap", "sluice-nats")["data"]["nats.conf"].as_str().unwrap().to_string();
            for i in 0..3 {
                assert!(
                    conf.contains(&format!("tls://sluice-nats-{i}.sluice-nats-headless.sluice.svc:6222")),
                    "{conf}"
                );
            }
        } else {
            // DPDK hosts: hugepages, locked memory, the vfio devices.
            let sts = find(&docs, "StatefulSet", "sluice-host-edge");
            let c = &sts["spec"]["template"]["spec"]["containers"][0];
            assert_eq!(c["resources"]["limits"]["hugepages-2Mi"], "2Gi");
            assert!(c["securityContext"]["capabilities"]["add"].as_array().unwrap().iter().any(|a| a == "IPC_LOCK"));
            assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/dev/vfio"));
            let rule = find(&docs, "PrometheusRule", "sluice");
            let alerts = documents(&std::fs::read_to_string(workspace().join("deploy/prometheus/alerts.yml")).unwrap());
            assert_eq!(rule["spec"]["groups"], alerts[0]["groups"]);
            let monitor = find(&docs, "ServiceMonitor", "sluice");
            assert_eq!(monitor["spec"]["jobLabel"], "sluice.io/job");
            let gateway = find(&docs, "Deployment", "sluice-gateway");
            let env = gateway["spec"]["template"]["spec"]["containers"][0]["env"].as_array().unwrap();
            assert!(env.iter().any(|e| e["name"] == "OTEL_EXPORTER_OTLP_ENDPOINT"));
        }
    }

    // NATS from elsewhere: no servers here, everyone pointed at those.
    let urls = "tls://n0.nats.example:4222,tls://n1.nats.example:4222";
    let external = dir.path().join("external-nats.yaml");
    std::fs::write(&external, format!("nats:\n  enabled: false\n  externalUrls: \"{urls}\"\n")).unwrap();
    let text = ok(template(&["-f", values, "-f", external.to_str().unwrap()]), "external NATS");
    let docs = documents(&text);
    assert!(!docs.iter().any(|d| d["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("sluice-nats"))));
    let toml = find(&docs, "ConfigMap", "sluice-gateway")["data"]["gateway.toml"].as_str().unwrap();
    assert!(toml.contains(&format!("nats = \"{urls}\"")), "{toml}");
    let host = &find(&docs, "StatefulSet", "sluice-host-default")["spec"]["template"]["spec"]["containers"][0];
    assert!(host["env"].as_array().unwrap().iter().any(|e| e["name"] == "SLUICE_NATS_URL" && e["value"] == urls));
    let r = template(&["-f", values, "--set", "nats.enabled=false"]);
    assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains("nats.externalUrls"));

    // Values that cannot work are refused with what to do.
    let r = template(&[]);
    assert!(!r.status.success() && String::from_utf8_lossy(&r.stderr).contains("make-secrets.sh"));
    for (group, says) in [
        ("{ name: Edge_1, replicas: 1, io: af_packet }", "lowercase"),
        ("{ name: edge, replicas: 1, io: xdp }", "neither af_packet nor dpdk"),
        ("{ replicas: 1, io: af_packet }", "every group needs a name"),
    ] {
        let file = dir.path().join("bad-values.yaml");
        std::fs::write(&file, format!("hosts:\n  groups:\n    - {group}\n")).unwrap();
        let r = template(&["-f", values, "-f", file.to_str().unwrap()]);
        let err = String::from_utf8_lossy(&r.stderr);
        assert!(!r.status.success() && err.contains(says), "{group}: {err}");
    }
}

/// A veth pair, one end for the host's af_packet port; removed on drop.
struct Veth(String);

impl Veth {
    fn new() -> Veth {
        let name = format!("slh{}", std::process::id() % 100_000);
        let peer = format!("{name}p");
        let _ = Command::new("ip").args(["link", "del", &name]).output();
        let st =
            Command::new("ip").args(["link", "add", &name, "type", "veth", "peer", "name", &peer]).status().unwrap();
        assert!(st.success(), "ip link add {name} type veth (needs root)");
        for n in [&name, &peer] {
            assert!(Command::new("ip").args(["link", "set", n, "up"]).status().unwrap().success());
        }
        Veth(name)
    }
}

impl Drop for Veth {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["link", "del", &self.0]).status();
    }
}

/// A container of the rendered chart, run as a process: its paths under
/// `root`, its addresses on loopback.
struct Pod {
    root: PathBuf,
    name: String,
    /// Text replaced in arguments, environment and files.
    rewrite: Vec<(String, String)>,
}

impl Pod {
    fn map(&self, s: &str) -> String {
        let mut s = s.replace("$(POD_NAME)", &self.name);
        for (from, to) in &self.rewrite {
            s = s.replace(from, to);
        }
        for dir in ["/etc/sluice/", "/etc/nats/tls/", "/etc/nats-config/", "/var/run/nats/", "/var/lib/sluice"] {
            s = s.replace(dir, &format!("{}{dir}", self.root.display()));
        }
        s
    }

    /// Writes a Secret's or ConfigMap's files where the pod mounts them,
    /// with the volume's mode (as the kubelet does: owned by root).
    fn mount(&self, at: &str, files: &[(String, Vec<u8>)], mode: u32) {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.root.join(at.trim_start_matches('/'));
        std::fs::create_dir_all(&dir).unwrap();
        for (name, data) in files {
            std::fs::write(dir.join(name), data).unwrap();
            std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(mode)).unwrap();
        }
    }

    fn command(&self, program: &Path, c: &Value) -> Command {
        let mut cmd = Command::new(program);
        for a in c["args"].as_array().into_iter().flatten() {
            cmd.arg(self.map(a.as_str().unwrap()));
        }
        cmd.env("POD_NAME", &self.name);
        for e in c["env"].as_array().into_iter().flatten() {
            if let Some(v) = e["value"].as_str() {
                cmd.env(e["name"].as_str().unwrap(), self.map(v));
            }
        }
        cmd
    }
}

/// The mode a pod spec gives the files of the volume of Secret `secret`.
fn mode_of(spec: &Value, secret: &str) -> u32 {
    let v = spec["volumes"].as_array().unwrap().iter().find(|v| v["secret"]["secretName"] == secret).unwrap();
    u32::try_from(v["secret"]["defaultMode"].as_u64().unwrap()).unwrap()
}

fn files_of(data: &serde_json::Map<String, Value>, secret: bool) -> Vec<(String, Vec<u8>)> {
    data.iter()
        .map(|(k, v)| (k.clone(), if secret { decode(v) } else { v.as_str().unwrap().as_bytes().to_vec() }))
        .collect()
}

#[test]
fn what_the_chart_renders_runs_a_gateway_nats_and_a_host_that_signs_in() {
    let _turn = beside_others();
    let dir = test_dir();
    let out = dir.path().join("secrets");
    // The servers' certificate also names 127.0.0.1, where this test reaches them.
    make_secrets(&out, &["--group", "default=1", "--nats-san", "IP:127.0.0.1"]);
    let secrets = documents(&std::fs::read_to_string(out.join("secrets.yaml")).unwrap());
    let veth = Veth::new();
    let mine = dir.path().join("values-test.yaml");
    std::fs::write(
        &mine,
        format!(
            "nats:\n  replicas: 1\nhosts:\n  groups:\n    - {{ name: default, replicas: 1, io: af_packet, interface: {}, ports: [0], resources: {{ requests: {{ cpu: 100m }}, limits: {{ memory: 1Gi }} }} }}\n",
            veth.0
        ),
    )
    .unwrap();
    let values = out.join("values-secrets.yaml");
    let text = ok(template(&["-f", values.to_str().unwrap(), "-f", mine.to_str().unwrap()]), "helm template");
    let docs = documents(&text);
    let (nats_port, nats_http, gw_port, gw_metrics, host_metrics) =
        (free_port(), free_port(), free_port(), free_port(), free_port());
    let gateway_url = format!("http://127.0.0.1:{gw_port}");
    let nats_host = "sluice-nats-0.sluice-nats-headless.sluice.svc";
    let common = vec![
        (format!("tls://{nats_host}:4222"), format!("tls://127.0.0.1:{nats_port}")),
        ("http://sluice-gateway.sluice.svc:8080".to_string(), gateway_url.clone()),
    ];

    // The NATS pod: its init container, the server, the auth-sync sidecar.
    let nats_sts = find(&docs, "StatefulSet", "sluice-nats");
    let spec = &nats_sts["spec"]["template"]["spec"];
    let mut rewrite = common.clone();
    rewrite.extend([
        ("0.0.0.0:4222".to_string(), format!("127.0.0.1:{nats_port}")),
        ("0.0.0.0:8222".to_string(), format!("127.0.0.1:{nats_http}")),
        ("store_dir: /data/".to_string(), format!("store_dir: {}/data/", dir.path().join("nats").display())),
        ("=/data/".to_string(), format!("={}/data/", dir.path().join("nats").display())),
    ]);
    let pod = Pod { root: dir.path().join("nats"), name: "sluice-nats-0".into(), rewrite };
    std::fs::create_dir_all(pod.root.join("data")).unwrap();
    std::fs::create_dir_all(pod.root.join("var/run/nats")).unwrap();
    pod.mount(
        "/etc/nats/tls",
        &files_of(&secret_data(&secrets, "sluice-nats-tls"), true),
        mode_of(spec, "sluice-nats-tls"),
    );
    let gw_secret = secret_data(&secrets, "sluice-gateway");
    pod.mount("/etc/sluice/secrets", &files_of(&gw_secret, true), mode_of(spec, "sluice-gateway"));
    let conf = find(&docs, "ConfigMap", "sluice-nats")["data"]["nats.conf"].as_str().unwrap();
    assert!(!conf.contains("cluster {"), "one server forms no cluster: {conf}");
    pod.mount("/etc/nats-config", &[("nats.conf".into(), pod.map(conf).into_bytes())], 0o644);
    let gateway_bin = env!("CARGO_BIN_EXE_sluice-gateway");
    let init = &spec["initContainers"][0];
    let boot = pod.command(Path::new(gateway_bin), init).output().unwrap();
    ok(boot, "the auth-bootstrap init container");
    let nats_c = spec["containers"].as_array().unwrap().iter().find(|c| c["name"] == "nats").unwrap();
    let mut nats = Proc {
        child: pod
            .command(&nats_server_bin(), nats_c)
            .env("SLUICE_NATS_ADVERTISE", format!("127.0.0.1:{nats_port}"))
            .stdout(log_file(dir.path(), "nats"))
            .stderr(log_file(dir.path(), "nats"))
            .spawn()
            .unwrap(),
        name: "nats-server".into(),
    };
    wait_for(30, "nats-server's /healthz", || {
        ureq::get(&format!("http://127.0.0.1:{nats_http}/healthz?js-enabled-only=true")).call().ok()
    });
    let sync_c = spec["containers"].as_array().unwrap().iter().find(|c| c["name"] == "auth-sync").unwrap();
    let mut sync = Proc {
        child: pod
            .command(Path::new(gateway_bin), sync_c)
            .stdout(log_file(dir.path(), "auth-sync"))
            .stderr(log_file(dir.path(), "auth-sync"))
            .spawn()
            .unwrap(),
        name: "auth-sync".into(),
    };

    // The gateway pod.
    let mut rewrite = common.clone();
    rewrite.extend([
        ("0.0.0.0:8080".to_string(), format!("127.0.0.1:{gw_port}")),
        ("0.0.0.0:9464".to_string(), format!("127.0.0.1:{gw_metrics}")),
    ]);
    let gpod = Pod { root: dir.path().join("gateway"), name: "sluice-gateway-x".into(), rewrite };
    std::fs::create_dir_all(gpod.root.join("var/lib/sluice")).unwrap();
    let gw_spec = &find(&docs, "Deployment", "sluice-gateway")["spec"]["template"]["spec"];
    gpod.mount("/etc/sluice/secrets", &files_of(&gw_secret, true), mode_of(gw_spec, "sluice-gateway"));
    let toml = find(&docs, "ConfigMap", "sluice-gateway")["data"]["gateway.toml"].as_str().unwrap();
    gpod.mount("/etc/sluice", &[("gateway.toml".into(), gpod.map(toml).into_bytes())], 0o644);
    let gw_c = &gw_spec["containers"][0];
    let token = String::from_utf8(decode(&gw_secret["admin-token"])).unwrap().trim().to_string();
    let mut gateway = Proc {
        child: gpod
            .command(Path::new(gateway_bin), gw_c)
            .env("SLUICE_ADMIN_TOKEN", &token)
            .stdout(log_file(dir.path(), "gateway"))
            .stderr(log_file(dir.path(), "gateway"))
            .spawn()
            .unwrap(),
        name: "sluice-gateway".into(),
    };
    wait_for(60, "the gateway's /readyz", || {
        ureq::get(&format!("http://127.0.0.1:{gw_metrics}/readyz")).call().ok().filter(|r| r.status() == 200)
    });

    // The operator registers the hosts as the script wrote.
    let cli_dir = sibling_bin("sluice").parent().unwrap().to_path_buf();
    let path = format!("{}:{}", cli_dir.display(), std::env::var("PATH").unwrap_or_default());
    let reg = Command::new("sh")
        .arg(out.join("register-hosts.sh"))
        .env("PATH", path)
        .env("SLUICE_URL", &gateway_url)
        .env("SLUICE_ADMIN_TOKEN", &token)
        .output()
        .unwrap();
    ok(reg, "register-hosts.sh");

    // The host pod signs in once the sidecar let it in.
    let host_sts = find(&docs, "StatefulSet", "sluice-host-default");
    let mut rewrite = common.clone();
    rewrite.push(("0.0.0.0:9464".to_string(), format!("127.0.0.1:{host_metrics}")));
    let hpod = Pod { root: dir.path().join("host"), name: "sluice-host-default-0".into(), rewrite };
    std::fs::create_dir_all(hpod.root.join("var/lib/sluice")).unwrap();
    let host_spec = &host_sts["spec"]["template"]["spec"];
    let host_secret = secret_data(&secrets, "sluice-host-default");
    hpod.mount("/etc/sluice/secrets", &files_of(&host_secret, true), mode_of(host_spec, "sluice-host-default"));
    let host_c = &host_spec["containers"][0];
    let mut host = Proc {
        child: hpod
            .command(&sibling_bin("sluice-host"), host_c)
            // Its own EAL runtime files (a pod has its own /var/run/dpdk).
            .arg(format!("--file-prefix=sluice-helm-{}", std::process::id()))
            .env("SLUICE_CACHE_DIR", workspace().join("target/sluice-cache"))
            .stdout(log_file(dir.path(), "host"))
            .stderr(log_file(dir.path(), "host"))
            .spawn()
            .unwrap(),
        name: "sluice-host".into(),
    };
    let api = Api { base: gateway_url.clone() };
    wait_for(60, "the host pod to be seen alive", || {
        let hosts = api.get(Some(&token), "/v1/hosts").body;
        hosts.as_array()?.iter().any(|h| h["host"] == "sluice-host-default-0" && h["alive"] == true).then_some(())
    });
    wait_for(30, "the host's /readyz", || {
        ureq::get(&format!("http://127.0.0.1:{host_metrics}/readyz")).call().ok().filter(|r| r.status() == 200)
    });
    let metrics = ureq::get(&format!("http://127.0.0.1:{host_metrics}/metrics"))
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    assert!(metrics.contains("sluice_host_"), "{metrics}");
    // It runs on its af_packet port.
    let groups = api.get(Some(&token), "/v1/groups/default").body;
    assert!(groups.to_string().contains("sluice-host-default-0"), "{groups}");

    host.term();
    gateway.term();
    sync.kill9();
    nats.kill9();
}
