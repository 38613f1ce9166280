//! Observability against real parts: a real Prometheus scrapes the
//! gateway's and a host's operator listeners, and what it stores agrees
//! with what the usage API bills; the shipped alert rules and the Grafana
//! dashboard's queries run in it; the probes answer what they check.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

use crate::support::*;
use serde_json::{Value, json};
use std::path::Path;
use std::process::{Command, Stdio};

/// Status and body of a GET; status 0 when nothing answers (yet).
fn get_text(url: &str) -> (u16, String) {
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    match agent.get(url).call() {
        Ok(mut r) => (r.status().as_u16(), r.body_mut().read_to_string().unwrap_or_default()),
        Err(e) => (0, e.to_string()),
    }
}

/// A Prometheus server (Debian's `prometheus`) scraping `targets` (job
/// name, address) every second, with the shipped alert rules.
struct Prometheus {
    _proc: Proc,
    url: String,
}

impl Prometheus {
    fn start(dir: &Path, targets: &[(&str, String)]) -> Prometheus {
        let bin = std::env::var("SLUICE_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let rules = workspace().join("deploy/prometheus/alerts.yml");
        let mut config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n",
            rules.display()
        );
        for (job, addr) in targets {
            config.push_str(&format!("  - job_name: {job}\n    static_configs:\n      - targets: [\"{addr}\"]\n"));
        }
        let conf = dir.join("prometheus.yml");
        std::fs::write(&conf, config).unwrap();
        let port = free_port();
        let log = std::fs::File::create(dir.join("prometheus.log")).unwrap();
        let child = Command::new(&bin)
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("prometheus-data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap_or_else(|e| panic!("{bin} could not start ({e}): `make setup` installs Debian's prometheus"));
        let url = format!("http://127.0.0.1:{port}");
        let p = Prometheus { _proc: Proc { child, name: "prometheus".into() }, url };
        wait_for(30, "prometheus to answer", || (get_text(&format!("{}/-/ready", p.url)).0 == 200).then_some(()));
        p
    }

    /// The result of an instant query (fails on a query error).
    fn query(&self, q: &str) -> Vec<Value> {
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut r = agent.get(&format!("{}/api/v1/query", self.url)).query("query", q).call().unwrap();
        let body: Value = r.body_mut().read_json().unwrap();
        assert_eq!(body["status"], "success", "query {q}: {body}");
        body["data"]["result"].as_array().cloned().unwrap_or_default()
    }

    /// `sum by (label)` of a query, as numbers.
    fn by(&self, q: &str, label: &str) -> std::collections::BTreeMap<String, f64> {
        self.query(q)
            .iter()
            .map(|s| {
                (
                    s["metric"][label].as_str().unwrap_or("").to_string(),
                    s["value"][1].as_str().unwrap().parse().unwrap(),
                )
            })
            .collect()
    }
}

fn packets_billed(api: &Api, key: &str) -> u64 {
    let usage = api.get(Some(key), "/v1/usage");
    assert_eq!(usage.status, 200, "{}", usage.body);
    usage_totals(&usage.body).values().map(|t| t[1]).sum()
}

#[test]
fn prometheus_scrapes_the_gateway_and_a_host_and_its_counts_equal_the_bill() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw_metrics = format!("127.0.0.1:{}", free_port());
    let gw = Gateway::start(&nats, dir.path(), &[("SLUICE_METRICS_LISTEN", &gw_metrics)]);
    let api = gw.api();
    let pcap = trace(dir.path(), 300);
    let report = dir.path().join("h1.json");
    let host_metrics = format!("127.0.0.1:{}", free_port());
    let replay = Replay { pcap: &pcap, loops: 3, pps: 20000, window_ms: 200, report: &report };
    let mut args = replay.args();
    args.extend(["--metrics-listen".to_string(), host_metrics.clone()]);
    let mut host = start_host(&nats, &gw, dir.path(), "h1", &args.iter().map(String::as_str).collect::<Vec<_>>());

    // Before anything is deployed the host is ready (it applied its
    // group's empty set), live, and serves metrics.
    wait_for(30, "the host's readiness", || {
        let (status, body) = get_text(&format!("http://{host_metrics}/readyz"));
        (status == 200).then_some(body)
    });
    assert_eq!(get_text(&format!("http://{host_metrics}/healthz")).0, 200);
    let (status, body) = get_text(&format!("http://{gw_metrics}/readyz"));
    assert_eq!(status, 200, "{body}");

    let mut keys = Vec::new();
    for t in ["alpha", "beta"] {
        let (id, key) = api.tenant(t);
        assert_eq!(api.upload(Some(&key), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
        let d = api.post(Some(&key), "/v1/deployments", &json!({ "name": "count", "module": "counter@1" }));
        assert_eq!(d.status, 201, "{}", d.body);
        api.wait_running(&key, "count", 1);
        keys.push((id, key));
    }
    let ready: Value = serde_json::from_str(&get_text(&format!("http://{host_metrics}/readyz")).1).unwrap();
    assert_eq!(ready["checks"]["deployments"]["running"], 2, "{ready}");
    assert_eq!(ready["checks"]["nats"], "connected", "{ready}");

    // Every pass of the capture goes through both deployments, and is billed.
    // Passes are counted per deployment.
    wait_for(60, "the 3 passes", || (host_report(&report)["traces"].as_u64() == Some(6)).then_some(()));
    let per_pass = read_count(&pcap);
    let billed: Vec<u64> = keys
        .iter()
        .map(|(_, key)| {
            wait_for(30, "usage to reach the host's count", || {
                let n = packets_billed(&api, key);
                (n == 3 * per_pass).then_some(n)
            })
        })
        .collect();

    // Prometheus reads the same counts off the host, per tenant.
    let prom =
        Prometheus::start(dir.path(), &[("sluice-gateway", gw_metrics.clone()), ("sluice-host", host_metrics.clone())]);
    let scraped = wait_for(60, "Prometheus to hold the per-tenant packet counts", || {
        let by = prom.by("sum by (tenant) (sluice_nf_packets_total)", "tenant");
        let all = keys.iter().zip(&billed).all(|((id, _), n)| by.get(id).copied() == Some(*n as f64));
        all.then_some(by)
    });
    assert_eq!(scraped.len(), 2, "{scraped:?}");
    // Each target is scraped at its own offset in the interval.
    wait_for(30, "both targets scraped and up", || {
        let up = prom.by("up", "job");
        (up.get("sluice-gateway") == Some(&1.0) && up.get("sluice-host") == Some(&1.0)).then_some(())
    });
    // Forwarded + dropped = packets for the counter (it forwards all).
    let forwarded = prom.by("sum by (tenant) (sluice_nf_packets_forwarded_total)", "tenant");
    for ((id, _), n) in keys.iter().zip(&billed) {
        assert_eq!(forwarded.get(id).copied(), Some(*n as f64), "{forwarded:?}");
    }
    // One guest-time value per batch: as many as calls into the NF.
    let calls = prom.by("sum by (tenant) (sluice_nf_invocations_total)", "tenant");
    let timed = prom.by("sum by (tenant) (sluice_nf_guest_time_seconds_count)", "tenant");
    assert_eq!(calls, timed, "guest-time samples per tenant vs calls");
    // The gateway counted the API's requests and the stored records.
    let requests = prom.by("sum by (route) (sluice_gateway_requests_total)", "route");
    assert!(requests.get("/v1/deployments").is_some_and(|n| *n >= 2.0), "{requests:?}");
    let records = prom.by("sum by (tenant) (sluice_gateway_meter_records_total)", "tenant");
    assert!(keys.iter().all(|(id, _)| records.get(id).is_some_and(|n| *n > 0.0)), "{records:?}");
    wait_for(30, "the gateway's sampled gauges", || {
        let running = prom.by("sluice_gateway_deployments", "status");
        (running.get("running") == Some(&2.0)).then_some(())
    });
    assert_eq!(prom.by("sluice_gateway_hosts", "group").get("default"), Some(&1.0));
    assert_eq!(prom.by("sluice_host_deployments", "host").get("h1"), Some(&2.0));

    // The shipped rules load and evaluate; the dashboard's queries run.
    let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
    let rules: Value = agent.get(&format!("{}/api/v1/rules", prom.url)).call().unwrap().body_mut().read_json().unwrap();
    let loaded: Vec<&Value> =
        rules["data"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
    assert_eq!(loaded.len(), 6, "{rules}");
    wait_for(30, "every rule evaluated", || {
        let rules: Value =
            agent.get(&format!("{}/api/v1/rules", prom.url)).call().unwrap().body_mut().read_json().unwrap();
        let all =
            rules["data"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap().clone());
        let healthy: Vec<Value> = all.collect();
        healthy.iter().all(|r| r["health"] == "ok").then_some(())
    });
    let dashboard: Value =
        serde_json::from_slice(&std::fs::read(workspace().join("deploy/grafana/sluice.json")).unwrap()).unwrap();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let q = target["expr"].as_str().unwrap().replace("$__rate_interval", "1m").replace("$tenant", ".*");
            prom.query(&q);
        }
    }
    let traffic = prom.by(
        "sum by (tenant) (rate(sluice_nf_packets_total[1m])) or sum by (tenant) (sluice_nf_packets_total)",
        "tenant",
    );
    assert_eq!(traffic.len(), 2, "{traffic:?}");

    // No metric names a flow: labels are bounded.
    let (_, text) = get_text(&format!("http://{host_metrics}/metrics"));
    for label in ["src", "dst", "flow", "port=\"0\",src"] {
        assert!(!text.contains(&format!("{label}=")), "a metric is labelled by {label}:\n{text}");
    }
    host.term();
    drop(prom);
}

/// The host's readiness fails while NATS is away, and comes back with it;
/// liveness holds throughout.
#[test]
fn a_hosts_readiness_follows_nats() {
    let _turn = beside_others();
    let dir = test_dir();
    let mut nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let addr = format!("127.0.0.1:{}", free_port());
    let mut host = start_host(&nats, &gw, dir.path(), "h1", &["--metrics-listen", &addr]);
    wait_for(30, "the host's readiness", || (get_text(&format!("http://{addr}/readyz")).0 == 200).then_some(()));
    let (status, text) = get_text(&format!("http://{addr}/metrics"));
    assert_eq!(status, 200);
    assert!(text.contains("sluice_host_heartbeat_age_seconds"), "{text}");
    nats.proc = None;
    let (status, body) = wait_for(30, "readiness to fail without NATS", || {
        let (s, b) = get_text(&format!("http://{addr}/readyz"));
        (s == 503).then_some((s, b))
    });
    let body: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(status, 503);
    assert_eq!(body["checks"]["nats"], "not connected", "{body}");
    assert_eq!(get_text(&format!("http://{addr}/healthz")).0, 200);
    nats.restart();
    wait_for(60, "readiness back with NATS", || (get_text(&format!("http://{addr}/readyz")).0 == 200).then_some(()));
    host.term();
}

/// A listener address in use stops the host with the reason.
#[test]
fn a_metrics_address_in_use_is_refused_at_start() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    register_host(&nats, &gw, "h1", "default");
    let status = host_command(&nats, dir.path(), "h1", &["--metrics-listen", &addr]).status().unwrap();
    assert!(!status.success());
    let err = std::fs::read_to_string(dir.path().join("h1.log")).unwrap();
    assert!(err.contains(&addr) && err.contains("--metrics-listen"), "{err}");
}

/// An OpenTelemetry Collector (`make setup` builds `otelcol-sluice` from
/// deploy/otel/builder.yaml) receiving OTLP over HTTP and writing what it
/// gets to JSON-lines files.
struct Collector {
    _proc: Proc,
    endpoint: String,
    protocol: &'static str,
    dir: std::path::PathBuf,
}

impl Collector {
    /// A collector the processes reach over `protocol`: `http/protobuf`
    /// or `grpc`.
    fn start(dir: &Path, protocol: &'static str) -> Collector {
        let bin = std::env::var("SLUICE_OTELCOL").map(std::path::PathBuf::from).unwrap_or_else(|_| {
            let gopath = Command::new("go").args(["env", "GOPATH"]).output().unwrap();
            std::path::PathBuf::from(String::from_utf8_lossy(&gopath.stdout).trim()).join("bin/otelcol-sluice")
        });
        assert!(bin.exists(), "{} is missing: `make setup` builds it", bin.display());
        let out = dir.join("otel");
        std::fs::create_dir_all(&out).unwrap();
        let port = free_port();
        let file = |signal: &str| {
            format!(
                "  file/{signal}:\n    path: {}\n    flush_interval: 100ms\n",
                out.join(format!("{signal}.jsonl")).display()
            )
        };
        let pipeline = |signal: &str| {
            format!(
                "    {signal}:\n      receivers: [otlp]\n      processors: [batch]\n      exporters: [file/{signal}]\n"
            )
        };
        let receiver = if protocol == "grpc" { "grpc" } else { "http" };
        let config = format!(
            "receivers:\n  otlp:\n    protocols:\n      {receiver}:\n        endpoint: 127.0.0.1:{port}\n\
             processors:\n  batch:\n    timeout: 100ms\n\
             exporters:\n{}{}{}\
             service:\n  telemetry:\n    metrics:\n      level: none\n    logs:\n      level: warn\n  pipelines:\n{}{}{}",
            file("traces"),
            file("metrics"),
            file("logs"),
            pipeline("traces"),
            pipeline("metrics"),
            pipeline("logs"),
        );
        let conf = dir.join("collector.yaml");
        std::fs::write(&conf, config).unwrap();
        let log = std::fs::File::create(dir.join("collector.log")).unwrap();
        let child = Command::new(&bin).arg("--config").arg(&conf).stdout(Stdio::null()).stderr(log).spawn().unwrap();
        let c = Collector {
            _proc: Proc { child, name: "otelcol".into() },
            endpoint: format!("http://127.0.0.1:{port}"),
            protocol,
            dir: out,
        };
        wait_for(30, "the collector to listen", || std::net::TcpStream::connect(("127.0.0.1", port)).ok());
        c
    }

    /// Every OTLP JSON object the collector wrote for `signal`.
    fn read(&self, signal: &str) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join(format!("{signal}.jsonl")))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// The variables that point a process at this collector.
    fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("OTEL_EXPORTER_OTLP_ENDPOINT", self.endpoint.clone()),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", self.protocol.into()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "500".into()),
            ("OTEL_BSP_SCHEDULE_DELAY", "100".into()),
            ("OTEL_BLRP_SCHEDULE_DELAY", "100".into()),
            ("OTEL_RESOURCE_ATTRIBUTES", "deployment.environment=test".into()),
        ]
    }
}

/// The string value of attribute `key` in an OTLP attribute list.
fn attr<'a>(attrs: &'a Value, key: &str) -> Option<&'a Value> {
    attrs.as_array()?.iter().find(|a| a["key"] == key).map(|a| &a["value"])
}

fn attr_str<'a>(attrs: &'a Value, key: &str) -> Option<&'a str> {
    attr(attrs, key).and_then(|v| v["stringValue"].as_str())
}

/// (service, span) pairs of every exported span.
fn spans(exports: &[Value]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for e in exports {
        for rs in e["resourceSpans"].as_array().into_iter().flatten() {
            let service = attr_str(&rs["resource"]["attributes"], "service.name").unwrap_or("").to_string();
            for ss in rs["scopeSpans"].as_array().into_iter().flatten() {
                for s in ss["spans"].as_array().into_iter().flatten() {
                    out.push((service.clone(), s.clone()));
                }
            }
        }
    }
    out
}

/// The latest cumulative value of counter `name` per `tenant`.
fn counter_by_tenant(exports: &[Value], name: &str) -> std::collections::BTreeMap<String, u64> {
    // Per attribute set, the point with the latest time.
    let mut latest: std::collections::BTreeMap<String, (u64, String, u64)> = Default::default();
    for e in exports {
        for rm in e["resourceMetrics"].as_array().into_iter().flatten() {
            for sm in rm["scopeMetrics"].as_array().into_iter().flatten() {
                for m in sm["metrics"].as_array().into_iter().flatten().filter(|m| m["name"] == name) {
                    for p in m["sum"]["dataPoints"].as_array().into_iter().flatten() {
                        let series = p["attributes"].to_string();
                        let t: u64 = p["timeUnixNano"].as_str().unwrap_or("0").parse().unwrap_or(0);
                        let v: u64 = p["asInt"].as_str().unwrap_or("0").parse().unwrap_or(0);
                        let tenant = attr_str(&p["attributes"], "tenant").unwrap_or("").to_string();
                        if latest.get(&series).is_none_or(|(old, _, _)| t >= *old) {
                            latest.insert(series, (t, tenant, v));
                        }
                    }
                }
            }
        }
    }
    let mut out = std::collections::BTreeMap::new();
    for (_, tenant, v) in latest.into_values() {
        *out.entry(tenant).or_default() += v;
    }
    out
}

#[test]
fn otlp_export_makes_one_trace_of_a_deployment_and_counts_what_usage_bills() {
    otlp_round_trip("http/protobuf");
}

#[test]
fn otlp_export_over_grpc_works_the_same() {
    otlp_round_trip("grpc");
}

fn otlp_round_trip(protocol: &'static str) {
    let _turn = beside_others();
    let dir = test_dir();
    let collector = Collector::start(dir.path(), protocol);
    let env = collector.env();
    let nats = Nats::start(dir.path());
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut gw = Gateway::start(&nats, dir.path(), &env_refs);
    let api = gw.api();
    let pcap = trace(dir.path(), 200);
    let report = dir.path().join("h1.json");
    let replay = Replay { pcap: &pcap, loops: 2, pps: 20000, window_ms: 200, report: &report };
    register_host(&nats, &gw, "h1", "default");
    let args = replay.args();
    let child = host_command(&nats, dir.path(), "h1", &args.iter().map(String::as_str).collect::<Vec<_>>())
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .spawn()
        .unwrap();
    let mut host = Proc { child, name: "sluice-host h1".into() };

    let (good_id, good) = api.tenant("good");
    let (_, bad) = api.tenant("bad");
    assert_eq!(api.upload(Some(&good), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    assert_eq!(api.upload(Some(&bad), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    let d = api.post(Some(&good), "/v1/deployments", &json!({ "name": "count", "module": "counter@1" }));
    assert_eq!(d.status, 201, "{}", d.body);
    let deployment = d.body["id"].as_str().unwrap().to_string();
    let p =
        api.post(Some(&bad), "/v1/deployments", &json!({ "name": "boom", "module": "hostile@1", "config": "panic:3" }));
    assert_eq!(p.status, 201, "{}", p.body);
    api.wait_running(&good, "count", 1);
    wait_for(60, "the 2 passes", || {
        let r = host_report(&report);
        let good = r["deployments"][&deployment]["packets_in"].as_u64().unwrap_or(0);
        (good == 2 * read_count(&pcap)).then_some(())
    });
    let billed = wait_for(30, "usage to reach the host's count", || {
        let n = packets_billed(&api, &good);
        (n == 2 * read_count(&pcap)).then_some(n)
    });
    // Stopping flushes what each process buffered.
    host.term();
    gw.proc.as_mut().unwrap().term();

    // One trace: the API request, the host applying the deployment (module
    // fetch, compile, start on its worker) and its first batch.
    // The collector writes what it receives within a few hundred ms.
    let complete = |all: &[(String, Value)]| {
        let Some((_, request)) =
            all.iter().find(|(service, s)| service == "sluice-gateway" && s["name"] == "POST /v1/deployments")
        else {
            return false;
        };
        all.iter()
            .any(|(svc, s)| svc == "sluice-host" && s["name"] == "first batch" && s["traceId"] == request["traceId"])
    };
    let all = wait_for(20, "the deployment's trace in the collector's file", || {
        let all = spans(&collector.read("traces"));
        complete(&all).then_some(all)
    });
    let request = all
        .iter()
        .find(|(service, s)| service == "sluice-gateway" && s["name"] == "POST /v1/deployments")
        .unwrap_or_else(|| panic!("no span of the deployment's request among {} spans", all.len()));
    let trace_id = request.1["traceId"].as_str().unwrap();
    let in_trace: Vec<&(String, Value)> = all.iter().filter(|(_, s)| s["traceId"] == trace_id).collect();
    let named = |name: &str| in_trace.iter().find(|(_, s)| s["name"] == name).map(|(svc, s)| (svc.as_str(), s));
    let (svc, apply) = named("apply deployment").unwrap_or_else(|| panic!("no host span in the trace: {in_trace:?}"));
    assert_eq!(svc, "sluice-host");
    assert_eq!(attr_str(&apply["attributes"], "deployment"), Some(deployment.as_str()));
    assert!(
        in_trace.iter().any(|(svc, s)| svc == "sluice-host"
            && s["name"] == "apply deployment"
            && s["parentSpanId"] == request.1["spanId"]),
        "the host's span is not the request's child"
    );
    for step in ["compile", "apply on worker", "first batch"] {
        assert!(named(step).is_some(), "no '{step}' span in the deployment's trace: {in_trace:?}");
    }

    // Metrics: the packets each tenant's NF handled, as billed.
    wait_for(20, "the exported packet counter to reach the bill", || {
        let packets = counter_by_tenant(&collector.read("metrics"), "sluice.nf.packets");
        (packets.get(&good_id).copied() == Some(billed)).then_some(())
    });

    // Logs: the hostile NF's traps, with their cause and the resource of
    // the host that ran it.
    wait_for(20, "a trap log with its cause in the collector's file", || {
        let logs = collector.read("logs");
        let trapped = logs.iter().flat_map(|e| e["resourceLogs"].as_array().cloned().unwrap_or_default()).any(|rl| {
            attr_str(&rl["resource"]["attributes"], "host.name") == Some("h1")
                && rl["scopeLogs"].as_array().into_iter().flatten().any(|sl| {
                    sl["logRecords"].as_array().into_iter().flatten().any(|r| {
                        r["body"]["stringValue"].as_str().is_some_and(|b| b.contains("NF trapped"))
                            && attr_str(&r["attributes"], "cause") == Some("panic")
                    })
                })
        });
        trapped.then_some(())
    });
}

/// `sluice logs` as the tenant with `key`.
fn sluice_logs(url: &str, key: &str, args: &[&str]) -> std::process::Output {
    Command::new(sibling_bin("sluice"))
        .arg("logs")
        .args(args)
        .env("SLUICE_URL", url)
        .env("SLUICE_API_KEY", key)
        .env_remove("SLUICE_ADMIN_TOKEN")
        .output()
        .unwrap()
}

/// A tenant sees what its NFs write and its NFs' traps with their causes;
/// another tenant sees none of it; a flood of lines is cut to the NF's
/// log rate.
#[test]
fn tenants_see_their_nfs_logs_and_traps_and_nobody_elses() {
    let _turn = beside_others();
    let dir = test_dir();
    let nats = Nats::start(dir.path());
    let gw = Gateway::start(&nats, dir.path(), &[]);
    let api = gw.api();
    let pcap = trace(dir.path(), 100);
    let report = dir.path().join("h1.json");
    let replay = Replay { pcap: &pcap, loops: 0, pps: 2000, window_ms: 200, report: &report };
    let mut host = start_replay_host(&nats, &gw, dir.path(), "h1", replay);
    let (a_id, a) = api.tenant("alpha");
    let (_, b) = api.tenant("beta");
    assert_eq!(api.upload(Some(&a), "hostile", "1", &std::fs::read(test_nf("hostile")).unwrap()).status, 201);
    assert_eq!(api.upload(Some(&b), "counter", "1", &std::fs::read(nf("counter")).unwrap()).status, 201);
    let boom =
        api.post(Some(&a), "/v1/deployments", &json!({ "name": "boom", "module": "hostile@1", "config": "panic:2" }));
    assert_eq!(boom.status, 201, "{}", boom.body);
    // 1000 stdout lines per batch, at most 20 a second get through.
    let chatty = api.post(
        Some(&a),
        "/v1/deployments",
        &json!({ "name": "chatty", "nfs": [{ "module": "hostile@1", "config": "print", "limits": { "log_lines_per_second": 20 } }] }),
    );
    assert_eq!(chatty.status, 201, "{}", chatty.body);
    let started = std::time::Instant::now();
    let d = api.post(Some(&b), "/v1/deployments", &json!({ "name": "count", "module": "counter@1" }));
    assert_eq!(d.status, 201, "{}", d.body);

    // The trap, with its cause, NF, version and host.
    let traps = wait_for(60, "alpha's trap lines", || {
        let r = api.get(Some(&a), "/v1/logs?deployment=boom&level=error");
        assert_eq!(r.status, 200, "{}", r.body);
        let lines = r.body["lines"].as_array().unwrap().clone();
        (!lines.is_empty()).then_some(lines)
    });
    let t = &traps[0];
    assert_eq!(t["kind"], "trap", "{t}");
    assert_eq!(t["cause"], "panic", "{t}");
    assert_eq!(t["level"], "error", "{t}");
    assert_eq!((t["nf"].as_str(), t["version"].as_str(), t["host"].as_str()), (Some("hostile"), Some("1"), Some("h1")));
    assert_eq!(t["deployment_name"], "boom");
    assert_eq!(t["fields"]["policy"], "fail-closed", "{t}");
    assert!(t["message"].as_str().unwrap().contains("panic") || !t["message"].as_str().unwrap().is_empty(), "{t}");
    // The lines the other NF printed, from stdout.
    let printed = wait_for(60, "alpha's printed lines", || {
        let r = api.get(Some(&a), "/v1/logs?deployment=chatty&limit=1000");
        let lines = r.body["lines"].as_array().unwrap().clone();
        (lines.len() >= 5).then_some(lines)
    });
    assert!(
        printed.iter().all(|l| l["kind"] == "log" && l["source"] == "stdout" && l["level"] == "info"),
        "{printed:?}"
    );

    // Beta sees nothing of alpha's, and cannot name alpha's deployment.
    let r = api.get(Some(&b), "/v1/logs");
    assert_eq!(r.status, 200);
    assert_eq!(r.body["lines"].as_array().unwrap().len(), 0, "{}", r.body);
    assert_eq!(api.get(Some(&b), &format!("/v1/logs?deployment={}", boom.body["id"].as_str().unwrap())).status, 404);
    // Logs are not events.
    let ev = api.get(Some(&a), "/v1/events?limit=1000");
    assert!(
        ev.body.as_array().unwrap().iter().all(|e| !e["kind"].as_str().unwrap().starts_with("sluice.")),
        "{}",
        ev.body
    );
    assert_eq!(api.get(Some(&a), "/v1/logs?level=loud").status, 400);
    assert_eq!(api.get(Some(&a), "/v1/logs?after=xyz").status, 400);

    // The flood is cut to the rate: over the run, at most 20 lines a
    // second (and one second's burst) reached the tenant.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let elapsed = started.elapsed().as_secs_f64();
    let (mut count, mut after) = (0usize, None::<String>);
    loop {
        let path = match &after {
            Some(c) => format!("/v1/logs?deployment=chatty&limit=1000&after={c}"),
            None => "/v1/logs?deployment=chatty&limit=1000&since=0&after=0".to_string(),
        };
        let r = api.get(Some(&a), &path);
        let lines = r.body["lines"].as_array().unwrap();
        count += lines.len();
        if lines.len() < 1000 {
            break;
        }
        after = r.body["next"].as_str().map(str::to_string);
    }
    assert!(count >= 20, "only {count} lines");
    assert!(count as f64 <= 20.0 * (elapsed + 1.0) + 20.0, "{count} lines in {elapsed:.1} s over a rate of 20/s");
    let usage = api.get(Some(&a), "/v1/usage");
    assert_eq!(usage.status, 200);

    // The CLI: the same lines, as JSON or text; following picks up new ones.
    let out =
        sluice_logs(&gw.url, &a, &["--deployment", "boom", "--level", "error", "--output", "json", "--limit", "5"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let lines: Vec<Value> =
        String::from_utf8_lossy(&out.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert!(!lines.is_empty() && lines.iter().all(|l| l["cause"] == "panic"), "{lines:?}");
    let out = sluice_logs(&gw.url, &a, &["--deployment", "boom", "--level", "error", "--limit", "3"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("TRAP (panic)") && text.contains("boom/hostile@1 h1"), "{text}");
    // The guest's own panic message (its stderr) is there too.
    let out = sluice_logs(&gw.url, &a, &["--deployment", "boom", "--level", "warn", "--limit", "50"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("[stderr]") && text.contains("panicked"), "{text}");
    let out = sluice_logs(&gw.url, &b, &[]);
    assert!(out.status.success() && out.stdout.is_empty(), "{}", String::from_utf8_lossy(&out.stdout));
    host.term();
    // The host's own log names the tenant, deployment and version of the
    // NF that trapped and of the lines it printed (no colour in a file).
    let log = std::fs::read_to_string(dir.path().join("h1.log")).unwrap();
    assert!(!log.contains('\u{1b}'), "colour codes in a log file");
    let boom_id = boom.body["id"].as_str().unwrap();
    let named = |what: &str, deployment: &str| {
        log.lines().any(|l| {
            l.contains(what)
                && l.contains(&format!("tenant={a_id}"))
                && l.contains(&format!("deployment={deployment}"))
                && l.contains("version=1")
        })
    };
    assert!(named("NF trapped", boom_id), "no trap line naming its tenant, deployment and version");
    assert!(named("sluice::guest", chatty.body["id"].as_str().unwrap()), "no guest line naming its owner");
}
