#!/usr/bin/env bash
# The tenant flow of `make demo` on the embedded default (`sluice dev`: the
# gateway and one pcap-fed host in one process, SQLite under target/demo/dev):
# create a tenant, upload the firewall, deploy it, push a trace, print the
# usage and the bill.
set -euo pipefail
trace=${1:?usage: demo-tenant.sh <trace.pcap>}
S=./target/release/sluice
D=target/demo/dev
rm -rf "$D"
mkdir -p "$D"
. "$(dirname "$0")/ports.sh"
port=$(free_ports 1)
export SLUICE_URL="http://127.0.0.1:$port"
export SLUICE_ADMIN_TOKEN="demo-admin-$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')"
unset SLUICE_API_KEY

echo "\$ sluice dev --listen 127.0.0.1:$port --data $D --config deploy/local/gateway-demo.toml &"
"$S" dev --listen "127.0.0.1:$port" --data "$D" --config deploy/local/gateway-demo.toml --window-ms 250 >"$D/dev.log" 2>&1 &
dev=$!
watch=
stop() {
  [ -n "$watch" ] && kill "$watch" 2>/dev/null || true
  kill -INT "$dev" 2>/dev/null && wait "$dev" 2>/dev/null || true
}
trap stop EXIT
for _ in $(seq 100); do
  curl -sf "$SLUICE_URL/healthz" >/dev/null && break
  kill -0 "$dev" 2>/dev/null || { cat "$D/dev.log"; exit 1; }
  sleep 0.1
done
head -2 "$D/dev.log"

echo
echo "\$ sluice tenant create acme"
SLUICE_API_KEY=$("$S" tenant create acme --key-only)
export SLUICE_API_KEY
echo "API key $SLUICE_API_KEY (exported as SLUICE_API_KEY)"
echo
echo "\$ sluice nf upload target/nfs/firewall.wasm --version 1.0.0"
"$S" nf upload target/nfs/firewall.wasm --version 1.0.0
echo
echo "\$ sluice deploy edge -m firewall@1.0.0 --config-file deploy/local/firewall-rules.json"
"$S" deploy edge -m firewall@1.0.0 --config-file deploy/local/firewall-rules.json
echo
echo "\$ cp $trace $D/spool/   # the dev host sends every capture in its spool through every deployment"
cp "$trace" "$D/spool/.incoming"
mv "$D/spool/.incoming" "$D/spool/office.pcap"
want=$(./target/release/sluice-host run --nf target/nfs/noop.wasm --in "$trace" --quiet | sed -n 's/^packets: *\([0-9]*\) in.*/\1/p')
for _ in $(seq 300); do
  got=$("$S" usage --json | python3 -c 'import json,sys; print(json.load(sys.stdin)["total"]["packets"])')
  [ "$got" = "$want" ] && break
  sleep 0.1
done
echo "metered $got of $want packets"
echo
echo "\$ sluice events --limit 5"
"$S" events --limit 5
echo
echo "\$ sluice usage"
"$S" usage
echo
echo "\$ sluice bill --period $(date -u +%Y-%m)"
"$S" bill --period "$(date -u +%Y-%m)"
echo
echo "\$ sluice bill --period $(date -u +%Y-%m) --csv"
"$S" bill --period "$(date -u +%Y-%m)" --csv
echo
echo "\$ sluice nf new guard --lang c --template firewall; cd guard; sluice nf watch &   # deploys guard with its sluice.toml config"
"$S" nf new guard --lang c --template firewall --dir "$D" >/dev/null
sluice_abs="$PWD/${S#./}"
(cd "$D/guard" && exec "$sluice_abs" nf watch --interval-ms 200) \
  >"$D/watch.out" 2>"$D/watch.err" &
watch=$!
waited() {
  for _ in $(seq 600); do
    grep -q "$1" "$D/watch.err" && return 0
    kill -0 "$watch" 2>/dev/null || break
    sleep 0.1
  done
  cat "$D/watch.err" >&2
  echo "demo: nf watch did not get to '$1'" >&2
  exit 1
}
waited "revision 1 runs"
echo "# (an edit of nf.c is saved)"
printf '\n/* tightened */\n' >>"$D/guard/nf.c"
waited "revision 2 runs"
sed 's/^/  /' "$D/watch.err"
echo "\$ sluice deployments   # guard now runs the second dev version, swapped in place"
"$S" deployments
kill "$watch" 2>/dev/null
watch=
echo
echo "\$ cd guard; sluice nf deploy   # the release: guard@0.1.0 from sluice.toml, swapped in for the dev version"
"$S" nf deploy "$D/guard"
echo
echo "\$ sluice dashboard   # a one-time sign-in link (no API key in it), good for a minute"
"$S" dashboard
echo
echo "(the dev cluster stops with this script; to keep one up, run: ./target/release/sluice dev --data $D"
echo " and open http://127.0.0.1:8080/dashboard (sign in with the tenant's API key) and /docs for the API)"
