#!/usr/bin/env bash
# Two tenants sharing one DPDK port through the gateway (`make demo`): a
# secure nats-server (deploy/nats), the gateway with host group `edge`
# exposing port 0, and one `sluice-host serve --dpdk` whose port is a
# net_pcap virtual device replaying VLAN-tagged traffic. Tenant alpha's
# firewall is attached to VLAN 100, tenant bravo's counter to VLAN 200;
# untagged traffic is nobody's. The gateway and the host export traces,
# metrics and logs to an OpenTelemetry Collector (the one `make setup`
# builds) and serve Prometheus metrics. Everything lives under
# target/demo/live.
set -euo pipefail
B=${SLUICE_BIN:-./target/release}
D=target/demo/live
rm -rf "$D"
mkdir -p "$D/nats"
nats=${SLUICE_NATS_SERVER:-$(command -v nats-server || echo "$HOME/go/bin/nats-server")}
[ -x "$nats" ] || { echo "demo-live.sh: nats-server not found: run make setup" >&2; exit 1; }
. "$(dirname "$0")/ports.sh"
read -r nats_port http_port metrics_gw_port metrics_host_port otlp_port <<<"$(free_ports 5)"
metrics_gw=127.0.0.1:$metrics_gw_port
metrics_host=127.0.0.1:$metrics_host_port
pids=()
stop() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}
# The collector stops last: the others flush into it as they stop.
stop_collector() { [ -z "${otel_pid:-}" ] || { kill -TERM "$otel_pid" 2>/dev/null; wait "$otel_pid" 2>/dev/null || true; }; }
trap 'stop; stop_collector' EXIT

# The collector: OTLP over HTTP in, one JSON-lines file per signal out.
otelcol="$(go env GOPATH 2>/dev/null)/bin/otelcol-sluice"
if [ -x "$otelcol" ]; then
  mkdir -p "$D/otel"
  cat >"$D/collector.yaml" <<YAML
receivers:
  otlp:
    protocols:
      http:
        endpoint: 127.0.0.1:$otlp_port
exporters:
  file/traces: {path: $PWD/$D/otel/traces.jsonl, flush_interval: 100ms}
  file/metrics: {path: $PWD/$D/otel/metrics.jsonl, flush_interval: 100ms}
  file/logs: {path: $PWD/$D/otel/logs.jsonl, flush_interval: 100ms}
service:
  telemetry: {metrics: {level: none}, logs: {level: warn}}
  pipelines:
    traces: {receivers: [otlp], exporters: [file/traces]}
    metrics: {receivers: [otlp], exporters: [file/metrics]}
    logs: {receivers: [otlp], exporters: [file/logs]}
YAML
  echo "\$ otelcol-sluice --config $D/collector.yaml &   # OTLP in, files out"
  "$otelcol" --config "$D/collector.yaml" >"$D/collector.log" 2>&1 &
  otel_pid=$!
  export OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:$otlp_port" OTEL_METRIC_EXPORT_INTERVAL=1000
else
  echo "(no OpenTelemetry Collector at $otelcol: make setup builds it; the run exports nothing)"
fi

echo "\$ deploy/nats/bootstrap.sh $D/pki && deploy/nats/bootstrap.sh $D/pki host h1   # CA, certificates, nkeys"
SLUICE_BIN=$B deploy/nats/bootstrap.sh "$D/pki" >/dev/null
SLUICE_BIN=$B deploy/nats/bootstrap.sh "$D/pki" host h1 >/dev/null
H=$D/pki/hosts/h1
admin="demo-admin-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
cat >"$D/gateway.toml" <<TOML
listen = "127.0.0.1:$http_port"
data-dir = "$D/gateway"
admin-token = "$admin"
cluster = "demo"
nats = "tls://127.0.0.1:$nats_port"
nats-nkey = "$D/pki/gateway.nk"
nats-ca = "$D/pki/tls/ca.pem"
nats-cert = "$D/pki/tls/gateway.pem"
nats-key = "$D/pki/tls/gateway-key.pem"
nats-auth-file = "$D/nats/sluice-auth.conf"
default-groups = ["edge"]
metrics-listen = "$metrics_gw"

[groups.edge]
ports = [0]
TOML
echo "\$ sluice-gateway --config $D/gateway.toml nats-auth && nats-server -c $D/nats/nats-server.conf &"
"$B/sluice-gateway" --config "$D/gateway.toml" nats-auth >"$D/nats-auth.log" 2>&1 || { cat "$D/nats-auth.log"; exit 1; }
sed -e "s|/etc/nats/tls/|$PWD/$D/pki/tls/|" -e "s|store_dir: /var/lib/nats|store_dir: \"$PWD/$D/jetstream\"|" \
  -e "s|^http: .*||" deploy/nats/nats-server.conf >"$D/nats/nats-server.conf"
"$nats" -c "$D/nats/nats-server.conf" -a 127.0.0.1 -p "$nats_port" >"$D/nats.log" 2>&1 &
nats_pid=$!
pids+=("$nats_pid")
echo "\$ sluice-gateway --config $D/gateway.toml &   # group edge exposes port 0"
"$B/sluice-gateway" --config "$D/gateway.toml" >"$D/gateway.log" 2>&1 &
pids+=($!)
export SLUICE_URL="http://127.0.0.1:$http_port" SLUICE_ADMIN_TOKEN="$admin"
unset SLUICE_API_KEY
for _ in $(seq 100); do
  curl -sf "$SLUICE_URL/healthz" >/dev/null && break
  sleep 0.1
done
curl -sf "$SLUICE_URL/healthz" >/dev/null || { cat "$D/gateway.log"; exit 1; }

echo
key=$("$B/sluice-host" keygen --show --out "$H/host.nk")
echo "\$ sluice host add h1 --group edge --nkey $key && nats-server --signal reload"
"$B/sluice" host add h1 --group edge --nkey "$key" >/dev/null
kill -HUP "$nats_pid"
A=$("$B/sluice" tenant create alpha --groups edge --key-only)
Z=$("$B/sluice" tenant create bravo --groups edge --key-only)
echo "\$ sluice tenant create alpha --groups edge; sluice tenant create bravo --groups edge"
echo
echo "\$ SLUICE_API_KEY=<alpha> sluice deploy web -m firewall@1.0.0 --group edge --attach port=0,vlan=100"
SLUICE_API_KEY=$A "$B/sluice" nf upload target/nfs/firewall.wasm --version 1.0.0 >/dev/null
SLUICE_API_KEY=$A "$B/sluice" deploy web -m firewall@1.0.0 --config-file deploy/local/firewall-rules.json \
  --group edge --attach port=0,vlan=100 --wait 0
echo "\$ SLUICE_API_KEY=<bravo> sluice deploy count -m counter@1.0.0 --group edge --attach port=0,vlan=200"
SLUICE_API_KEY=$Z "$B/sluice" nf upload target/nfs/counter.wasm --version 1.0.0 >/dev/null
SLUICE_API_KEY=$Z "$B/sluice" deploy count -m counter@1.0.0 --group edge --attach port=0,vlan=200 --wait 0
echo "\$ SLUICE_API_KEY=<bravo> sluice deploy peek -m counter@1.0.0 --group edge --attach port=0,vlan=100,dst=10.0.0.0/8"
if SLUICE_API_KEY=$Z "$B/sluice" deploy peek -m counter@1.0.0 --group edge --attach port=0,vlan=100,dst=10.0.0.0/8 --wait 0 2>"$D/peek.err"; then
  echo "demo-live.sh: an overlapping attachment was accepted" >&2
  exit 1
fi
sed 's/^/  /' "$D/peek.err"

echo
"$B/sluice-host" synth --sessions 20000 --seed 7 --vlans 100,200,0 --out "$D/tagged.pcap" >/dev/null
echo "\$ sluice-host serve --group edge --host-id h1 ... --dpdk -- --no-huge --no-pci --vdev=net_pcap0,rx_pcap=tagged.pcap,tx_pcap=out.pcap"
"$B/sluice-host" serve --nats "tls://127.0.0.1:$nats_port" --cluster demo --group edge --host-id h1 \
  --nats-nkey "$H/host.nk" --nats-ca "$H/ca.pem" --nats-cert "$H/h1.pem" --nats-key "$H/h1-key.pem" \
  --state-dir "$D/h1" --report "$D/h1.json" --window-ms 250 --metrics-listen "$metrics_host" --dpdk --workers 1 -- \
  --no-huge --no-pci -m 256 -l 0 --file-prefix "sluice-demo-$$" --log-level=lib.eal:error \
  "--vdev=net_pcap0,rx_pcap=$D/tagged.pcap,tx_pcap=$D/out.pcap" >"$D/h1.log" 2>&1 &
host=$!
total=$(python3 -c "import struct,sys; d=open(sys.argv[1],'rb').read(); i,n=24,0
while i < len(d): i += 16 + struct.unpack_from('<I', d, i+8)[0]; n += 1
print(n)" "$D/tagged.pcap")
for _ in $(seq 600); do
  seen=$(python3 -c 'import json,sys
try: r = json.load(open(sys.argv[1]))
except Exception: print(0); sys.exit()
print(sum(d["packets_in"] for d in r["deployments"].values()) + r.get("unmatched", 0))' "$D/h1.json" 2>/dev/null || echo 0)
  [ "$seen" = "$total" ] && break
  kill -0 "$host" 2>/dev/null || { cat "$D/h1.log"; exit 1; }
  sleep 0.1
done
# What Prometheus would scrape, as the host stops.
sleep 0.5
curl -sf "http://$metrics_host/metrics" >"$D/h1.metrics.txt" || true
kill -TERM "$host"
wait "$host" || true
python3 - "$D/h1.json" "$total" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"host h1 took {sys.argv[2]} packets from port 0:")
for d in r["deployments"].values():
    print(f"  tenant {d['tenant']} deployment {d['name']}: {d['packets_in']} in, {d['packets_out']} forwarded")
print(f"  unclaimed (untagged, dropped, billed to nobody): {r['unmatched']}")
PY
echo
for t in alpha bravo; do
  k=$A; [ $t = bravo ] && k=$Z
  # What the host ran for this tenant's deployment is what the gateway bills.
  want=$(python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); print(sum(d["packets_in"] for d in r["deployments"].values() if d["name"] == sys.argv[2]))' "$D/h1.json" "$([ $t = alpha ] && echo web || echo count)")
  for _ in $(seq 100); do
    got=$(SLUICE_API_KEY=$k "$B/sluice" usage --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["packets"])')
    [ "$got" = "$want" ] && break
    sleep 0.1
  done
  [ "$got" = "$want" ] || { echo "demo-live.sh: $t is billed $got packets, its deployment ran $want" >&2; exit 1; }
  echo "\$ SLUICE_API_KEY=<$t> sluice usage"
  SLUICE_API_KEY=$k "$B/sluice" usage
done
curl -sf "http://$metrics_gw/metrics" >"$D/gateway.metrics.txt" || true
stop
stop_collector
trap - EXIT
echo
{
echo "where to see this run (README, Observability):"
echo "  Prometheus metrics of the host and the gateway, as scraped at the end: $D/h1.metrics.txt, $D/gateway.metrics.txt"
echo "    e.g. $(grep -m1 '^sluice_nf_packets_total' "$D/h1.metrics.txt" 2>/dev/null || echo '(none)')"
if [ -n "${otel_pid:-}" ]; then
  python3 - "$D/otel" <<'PY'
import json, sys, os
d = sys.argv[1]
def read(name):
    p = os.path.join(d, name)
    return [json.loads(l) for l in open(p)] if os.path.exists(p) else []
spans = [(rs, s) for e in read("traces.jsonl") for rs in e.get("resourceSpans", [])
         for ss in rs.get("scopeSpans", []) for s in ss.get("spans", [])]
deploys = {s["traceId"] for _, s in spans if s["name"] == "POST /v1/deployments"}
joined = {s["traceId"] for _, s in spans if s["name"] == "first batch"} & deploys
logs = sum(len(sl.get("logRecords", [])) for e in read("logs.jsonl") for rl in e.get("resourceLogs", []) for sl in rl.get("scopeLogs", []))
points = sum(1 for e in read("metrics.jsonl") for rm in e.get("resourceMetrics", []) for sm in rm.get("scopeMetrics", []) for m in sm.get("metrics", []))
print(f"  OTLP traces: {d}/traces.jsonl ({len(spans)} spans; {len(joined)} deployments traced from their API request to their first batch on the host, of {len(deploys)} requests)")
print(f"  OTLP metrics: {d}/metrics.jsonl ({points} metric exports); logs: {d}/logs.jsonl ({logs} records)")
PY
fi
echo "  a Grafana dashboard over these metrics: deploy/grafana/sluice.json; alert rules: deploy/prometheus/alerts.yml"
} | tee "$D/observability.txt"
