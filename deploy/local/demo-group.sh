#!/usr/bin/env bash
# A host group behind its dispatcher (`make demo`): a secure nats-server,
# the gateway, three `sluice-host serve --dpdk` hosts of group `edge` and
# one `sluice-host steer` dispatcher, connected by memif links (DPDK's
# shared-memory interface between processes: each host serves one, the
# dispatcher connects to all three). The dispatcher replays a trace and
# sends every flow to its owner in the group's flow-ownership table; each
# host runs tenant alpha's counter and writes what it forwards to a
# capture. Then alpha swaps the counter for a stateful firewall, clients
# open 600 connections, a host is drained and another killed: the server's
# replies pass on the hosts the connections moved to, because each host
# replicated its connections' state to their next owners over NATS.
# Everything lives under target/demo/group.
set -euo pipefail
B=${SLUICE_BIN:-./target/release}
D=target/demo/group
rm -rf "$D"
mkdir -p "$D/nats"
nats=${SLUICE_NATS_SERVER:-$(command -v nats-server || echo "$HOME/go/bin/nats-server")}
[ -x "$nats" ] || { echo "demo-group.sh: nats-server not found: run make setup" >&2; exit 1; }
. "$(dirname "$0")/ports.sh"
read -r nats_port http_port <<<"$(free_ports 2)"
pids=()
stop() { for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null || true; }
trap stop EXIT

SLUICE_BIN=$B deploy/nats/bootstrap.sh "$D/pki" >/dev/null
for h in h1 h2 h3 d1; do SLUICE_BIN=$B deploy/nats/bootstrap.sh "$D/pki" host "$h" >/dev/null; done
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
host-silence-ms = 1500

[groups.edge]
ports = [0, 1]
TOML
"$B/sluice-gateway" --config "$D/gateway.toml" nats-auth >"$D/nats-auth.log" 2>&1 || { cat "$D/nats-auth.log"; exit 1; }
sed -e "s|/etc/nats/tls/|$PWD/$D/pki/tls/|" -e "s|store_dir: /var/lib/nats|store_dir: \"$PWD/$D/jetstream\"|" \
  -e "s|^http: .*||" deploy/nats/nats-server.conf >"$D/nats/nats-server.conf"
"$nats" -c "$D/nats/nats-server.conf" -a 127.0.0.1 -p "$nats_port" >"$D/nats.log" 2>&1 &
nats_pid=$!
pids+=("$nats_pid")
"$B/sluice-gateway" --config "$D/gateway.toml" >"$D/gateway.log" 2>&1 &
pids+=($!)
export SLUICE_URL="http://127.0.0.1:$http_port" SLUICE_ADMIN_TOKEN="$admin"
unset SLUICE_API_KEY
for _ in $(seq 100); do
  curl -sf "$SLUICE_URL/healthz" >/dev/null && break
  sleep 0.1
done
curl -sf "$SLUICE_URL/healthz" >/dev/null || { cat "$D/gateway.log"; exit 1; }

echo "\$ sluice host add h1|h2|h3 --group edge --nkey ...; sluice host add d1 --group edge --dispatcher --nkey ..."
for h in h1 h2 h3; do
  "$B/sluice" host add "$h" --group edge --nkey "$("$B/sluice-host" keygen --show --out "$D/pki/hosts/$h/host.nk")" >/dev/null
done
"$B/sluice" host add d1 --group edge --dispatcher --nkey "$("$B/sluice-host" keygen --show --out "$D/pki/hosts/d1/host.nk")" >/dev/null
kill -HUP "$nats_pid"
sleep 0.5
A=$("$B/sluice" tenant create alpha --groups edge --key-only)
SLUICE_API_KEY=$A "$B/sluice" nf upload target/nfs/counter.wasm --version 1.0.0 >/dev/null
echo "\$ SLUICE_API_KEY=<alpha> sluice deploy count -m counter@1.0.0 --group edge --attach port=0,out=1"
SLUICE_API_KEY=$A "$B/sluice" deploy count -m counter@1.0.0 --group edge --attach port=0,out=1 --wait 0 >/dev/null

python3 -c 'import struct,sys; open(sys.argv[1],"wb").write(struct.pack("<IHHiIII",0xa1b2c3d4,2,4,0,0,65535,1))' "$D/empty.pcap"
echo "\$ sluice-host serve --group edge --host-id hN --capacity-pps 1000000 --dpdk -- ... --vdev=net_memif0,role=server,socket=hN.sock --vdev=net_pcap1,tx_pcap=hN.out.pcap   (N = 1, 2, 3)"
declare -A host_pid
for h in h1 h2 h3; do
  P=$D/pki/hosts/$h
  "$B/sluice-host" serve --nats "tls://127.0.0.1:$nats_port" --cluster demo --group edge --host-id "$h" \
    --nats-nkey "$P/host.nk" --nats-ca "$P/ca.pem" --nats-cert "$P/$h.pem" --nats-key "$P/$h-key.pem" \
    --state-dir "$D/$h" --report "$D/$h.json" --window-ms 250 --heartbeat-ms 300 --capacity-pps 1000000 \
    --dpdk --workers 1 -- --no-huge --no-pci -m 256 -l 0 --file-prefix "sluice-demo-$h-$$" --log-level=lib.eal:error \
    "--vdev=net_memif0,role=server,socket=$PWD/$D/$h.sock" \
    "--vdev=net_pcap1,rx_pcap=$D/empty.pcap,tx_pcap=$D/$h.out.pcap" >"$D/$h.log" 2>&1 &
  host_pid[$h]=$!
  pids+=($!)
done
for _ in $(seq 300); do
  # Three active hosts, each having read the current table.
  active=$("$B/sluice" groups show edge --output json | python3 -c 'import json,sys
g = json.load(sys.stdin)
print(g["active_hosts"] if all(m["table_version"] == g["table_version"] for m in g["members"]) else 0)' 2>/dev/null || echo 0)
  running=$(curl -sf -H "Authorization: Bearer $A" "$SLUICE_URL/v1/deployments/count" | python3 -c 'import json,sys; print(json.load(sys.stdin)["status"])' 2>/dev/null || echo pending)
  [ "$active" = 3 ] && [ "$running" = running ] && break
  sleep 0.1
done
[ "$active" = 3 ] && [ "$running" = running ] || { echo "demo-group.sh: the group did not get its three hosts running the counter" >&2; tail -5 "$D"/h*.log >&2; exit 1; }
echo "\$ sluice groups"
"$B/sluice" groups

"$B/sluice-host" synth --sessions 5000 --seed 7 --out "$D/trace.pcap" >/dev/null
echo
echo "\$ sluice-host steer --group edge --id d1 --to h1=1 --to h2=2 --to h3=3 --tx-retry-us 20000 -- ... --vdev=net_pcap0,rx_pcap=trace.pcap --vdev=net_memif1..3,role=client"
echo "  (the capture is read as fast as the hosts take it: a full link is retried, not dropped)"
P=$D/pki/hosts/d1
"$B/sluice-host" steer --nats "tls://127.0.0.1:$nats_port" --cluster demo --group edge --id d1 \
  --nats-nkey "$P/host.nk" --nats-ca "$P/ca.pem" --nats-cert "$P/d1.pem" --nats-key "$P/d1-key.pem" \
  --ingress 0 --to h1=1 --to h2=2 --to h3=3 --workers 1 --idle-exit-ms 1500 --report "$D/steer.json" \
  --tx-retry-us 20000 -- \
  --no-huge --no-pci -m 512 -l 0 --file-prefix "sluice-demo-d1-$$" --log-level=lib.eal:error \
  "--vdev=net_pcap0,rx_pcap=$D/trace.pcap,tx_pcap=$D/ingress-tx.pcap" \
  "--vdev=net_memif1,role=client,socket=$PWD/$D/h1.sock" \
  "--vdev=net_memif2,role=client,socket=$PWD/$D/h2.sock" \
  "--vdev=net_memif3,role=client,socket=$PWD/$D/h3.sock" 2>"$D/steer.log" | sed 's/^/  /'
total=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["forwarded"])' "$D/steer.json")
for _ in $(seq 200); do
  got=$(SLUICE_API_KEY=$A "$B/sluice" usage --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["packets"])')
  [ "$got" = "$total" ] && break
  sleep 0.1
done
[ "$got" = "$total" ] || { echo "demo-group.sh: alpha is billed $got packets, the dispatcher sent $total" >&2; exit 1; }
echo "alpha is billed $got packets: each of the $total packets the dispatcher sent ran once, on its flow's owner"


# Connections keep their state when their host changes: tenant alpha
# replaces the counter by a stateful firewall that lets clients of
# 10.0.0.0/8 open connections to port 80 and drops anything else, so a
# server reply passes only on a host that holds its connection's state.
echo
echo "\$ SLUICE_API_KEY=<alpha> sluice deploy count -m firewall@1.0.0 --config-file fw.json ...   # default deny; allow tcp 10.0.0.0/8 -> :80"
SLUICE_API_KEY=$A "$B/sluice" nf upload target/nfs/firewall.wasm --version 1.0.0 >/dev/null
echo '{"default":"deny","rules":[{"action":"allow","proto":"tcp","src":"10.0.0.0/8","dst-ports":"80"}]}' >"$D/fw.json"
SLUICE_API_KEY=$A "$B/sluice" deploy count -m firewall@1.0.0 --config-file "$D/fw.json" --group edge --attach port=0,out=1 --wait 30 >/dev/null
python3 - "$D" <<'PY'
import struct, sys
d = sys.argv[1]
def tcp(src, sport, dst, dport, flags, seq):
    tcp = struct.pack("!HHIIBBHHH", sport, dport, seq, 0, 5 << 4, flags, 65535, 0, 0)
    ip = struct.pack("!BBHHHBBH4s4s", 0x45, 0, 20 + len(tcp), 0, 0, 64, 6, 0, bytes(src), bytes(dst))
    return b"\x02\0\0\0\0\x02" + b"\x02\0\0\0\0\x01" + b"\x08\x00" + ip + tcp
def write(name, frames):
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xa1b2c3d4, 2, 4, 0, 0, 65535, 1))
        for i, fr in enumerate(frames):
            f.write(struct.pack("<IIII", 1, i, len(fr), len(fr)) + fr)
conns = [([10, 9, i // 250, i % 250 + 1], 20000 + i) for i in range(600)]
server = [192, 0, 2, 80]
write("syn.pcap", [tcp(c, p, server, 80, 0x02, 1) for c, p in conns])
write("reply1.pcap", [tcp(server, 80, c, p, 0x12, 2) for c, p in conns])
write("reply2.pcap", [tcp(server, 80, c, p, 0x10, 3) for c, p in conns])
PY
sleep 1
# One dispatcher pass over a capture, to the hosts given (h=port ...).
steer_pass() {
  local pcap=$1; shift
  local to=() vdevs=() i=1
  for h in "$@"; do
    to+=(--to "$h=$i")
    vdevs+=("--vdev=net_memif$i,role=client,socket=$PWD/$D/$h.sock")
    i=$((i + 1))
  done
  "$B/sluice-host" steer --nats "tls://127.0.0.1:$nats_port" --cluster demo --group edge --id d1 \
    --nats-nkey "$P/host.nk" --nats-ca "$P/ca.pem" --nats-cert "$P/d1.pem" --nats-key "$P/d1-key.pem" \
    --ingress 0 "${to[@]}" --workers 1 --idle-exit-ms 1000 --report "$D/steer-pass.json" --tx-retry-us 20000 -- \
    --no-huge --no-pci -m 512 -l 0 --file-prefix "sluice-demo-d1-$$" --log-level=lib.eal:error \
    "--vdev=net_pcap0,rx_pcap=$D/$pcap,tx_pcap=$D/ingress-tx.pcap" "${vdevs[@]}" >/dev/null 2>>"$D/steer.log"
}
# Packets the firewall passed on each host so far, and the peer-state counters.
passed() { python3 - "$D" "$@" <<'PY'
import json, sys
d, hosts = sys.argv[1], sys.argv[2:]
n = 0
for h in hosts:
    r = json.load(open(f"{d}/{h}.json"))
    n += sum(v.get("packets_out", 0) for v in r["deployments"].values())
print(n)
PY
}
peer() { python3 - "$D" "$@" <<'PY'
import json, sys
d, hosts = sys.argv[1], sys.argv[2:]
for h in hosts:
    p = json.load(open(f"{d}/{h}.json")).get("peer", {})
    print(f"  {h}: state of {p.get('flows_sent', 0)} flows sent to peers, {p.get('store', {}).get('replicas_held', 0)} replicas held, {p.get('flows_imported', 0)} imported when their flow arrived")
PY
}
echo "600 clients open connections through the dispatcher (their SYNs), spread over h1, h2, h3"
steer_pass syn.pcap h1 h2 h3
sleep 1.5
base=$(passed h1 h2 h3)

echo
echo "\$ sluice groups drain edge h3     # h3 owns no slots: its flows go to their next owners, with their state"
"$B/sluice" groups drain edge h3 >/dev/null
sleep 1.5
"$B/sluice" groups | sed -n '1p;/h3/p'
echo "the server answers every connection (SYN-ACKs), now over h1 and h2 only"
steer_pass reply1.pcap h1 h2
sleep 1.5
now=$(passed h1 h2 h3)
echo "replies passed: $((now - base)) of 600 (a reply passes only where its connection's state is)"
peer h1 h2 h3
[ $((now - base)) = 600 ] || { echo "demo-group.sh: $((600 - now + base)) replies were dropped after the drain" >&2; exit 1; }

echo
echo "\$ kill -9 <h2>                    # silent for host-silence-ms (1.5 s): gone; its flows go to their next owners"
before_kill=$(passed h1)
{ kill -9 "${host_pid[h2]}" && wait "${host_pid[h2]}"; } 2>/dev/null || true
sleep 2.5
"$B/sluice" groups | sed -n '1p;/h2/p'
echo "the server sends on every connection, now all to h1"
steer_pass reply2.pcap h1
sleep 1.5
after_kill=$(passed h1)
echo "packets passed on h1: $((after_kill - before_kill)) of 600, with the state h2 and h3 had replicated to it"
peer h1
[ $((after_kill - before_kill)) = 600 ] || { echo "demo-group.sh: $((600 - after_kill + before_kill)) packets were dropped after the kill" >&2; exit 1; }
