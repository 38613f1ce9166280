#!/usr/bin/env bash
# The Secrets of a Sluice release on Kubernetes, made with the same tools
# as a machine install (deploy/nats/bootstrap.sh): the NATS CA and the
# servers' certificate (named for the release's services), the gateway's
# admin token, nkey and client certificate, and per host pod its nkey and
# client certificate. Writes, under OUT:
#   secrets.yaml          kubectl apply -n NAMESPACE -f OUT/secrets.yaml
#   values-secrets.yaml   helm install RELEASE deploy/helm/sluice -n NAMESPACE -f OUT/values-secrets.yaml
#   register-hosts.sh     `sluice host add` for every host pod, once the gateway answers
#   pki/                  the CA key and every credential: keep it offline
# Existing credentials are kept: run it again with more hosts to add them.
#
#   make-secrets.sh OUT --release sluice --namespace sluice --group default=2 [--group edge=3 ...]
#                   [--nats-san DNS:nats.example.net,IP:203.0.113.7]
#
# --nats-san adds names to the NATS servers' certificate: those that hosts
# outside the cluster reach them by (a LoadBalancer in front of port 4222).
# Needs openssl, and sluice-gateway / sluice-host on PATH (or SLUICE_BIN=dir).
set -euo pipefail
usage() { echo "usage: make-secrets.sh OUT --release NAME --namespace NS --group NAME=HOSTS [--group ...] [--nats-san SAN]" >&2; exit 2; }
out=${1:-}; [ -n "$out" ] && [ "${out#-}" = "$out" ] || usage
shift
release="" ns="" groups=() extra_san=""
while [ $# -gt 0 ]; do
  case $1 in
    --release) release=${2:?}; shift 2 ;;
    --namespace) ns=${2:?}; shift 2 ;;
    --group) groups+=("${2:?}"); shift 2 ;;
    --nats-san) extra_san=${2:?}; shift 2 ;;
    *) usage ;;
  esac
done
[ -n "$release" ] && [ -n "$ns" ] && [ ${#groups[@]} -gt 0 ] || usage
dns='^[a-z0-9]([a-z0-9-]*[a-z0-9])?$'
for v in "$release" "$ns"; do
  [[ $v =~ $dns ]] || { echo "make-secrets.sh: '$v' is not a DNS label (lowercase letters, digits, '-')" >&2; exit 2; }
done
here=$(cd "$(dirname "$0")" && pwd)
bin() {
  if [ -n "${SLUICE_BIN:-}" ]; then echo "$SLUICE_BIN/$1"
  elif command -v "$1" >/dev/null; then command -v "$1"
  elif [ -x "$here/../../target/release/$1" ]; then echo "$here/../../target/release/$1"
  else echo "make-secrets.sh: $1 not found; build it (make build) or set SLUICE_BIN" >&2; exit 1
  fi
}
mkdir -p "$out"
pki="$out/pki"
nats="$release-nats"
san="DNS:$nats,DNS:$nats.$ns.svc,DNS:$nats.$ns.svc.cluster.local"
san="$san,DNS:*.$nats-headless.$ns.svc,DNS:*.$nats-headless.$ns.svc.cluster.local${extra_san:+,$extra_san}"
"$here/../nats/bootstrap.sh" "$pki" "$san" >/dev/null
umask 077
[ -f "$pki/admin-token" ] || openssl rand -hex 32 >"$pki/admin-token"
gateway_key=$("$(bin sluice-host)" keygen --show --out "$pki/gateway.nk")

b64() { base64 -w0 <"$1"; }
# secret NAME KEY=FILE...
secret() {
  local name=$1 kv
  shift
  printf -- '---\napiVersion: v1\nkind: Secret\nmetadata:\n  name: %s\n  namespace: %s\n' "$name" "$ns"
  printf '  labels:\n    app.kubernetes.io/part-of: sluice\n    app.kubernetes.io/instance: %s\ntype: Opaque\ndata:\n' "$release"
  for kv in "$@"; do printf '  %s: %s\n' "${kv%%=*}" "$(b64 "${kv#*=}")"; done
}

{
  echo "# Secrets of Sluice release '$release' in namespace '$ns' (make-secrets.sh)."
  secret "$release-nats-tls" "ca.pem=$pki/tls/ca.pem" "server.pem=$pki/tls/server.pem" "server-key.pem=$pki/tls/server-key.pem"
  secret "$release-gateway" "admin-token=$pki/admin-token" "gateway.nk=$pki/gateway.nk" "ca.pem=$pki/tls/ca.pem" \
    "gateway.pem=$pki/tls/gateway.pem" "gateway-key.pem=$pki/tls/gateway-key.pem"
} >"$out/secrets.yaml"
echo "# sluice host add for every host pod of release '$release' (make-secrets.sh)." >"$out/register-hosts.sh"
echo "set -e" >>"$out/register-hosts.sh"
for g in "${groups[@]}"; do
  name=${g%%=*} count=${g#*=}
  [[ $name =~ $dns ]] || { echo "make-secrets.sh: group '$name' is not a DNS label" >&2; exit 2; }
  [[ $count =~ ^[0-9]+$ ]] && [ "$count" -ge 1 ] && [ "$count" -le 256 ] ||
    { echo "make-secrets.sh: --group $g: give NAME=HOSTS with 1 to 256 hosts" >&2; exit 2; }
  files=("ca.pem=$pki/tls/ca.pem")
  for ((i = 0; i < count; i++)); do
    id="$release-host-$name-$i"
    "$here/../nats/bootstrap.sh" "$pki" host "$id" >/dev/null
    files+=("$id.nk=$pki/hosts/$id/host.nk" "$id.pem=$pki/hosts/$id/$id.pem" "$id-key.pem=$pki/hosts/$id/$id-key.pem")
    key=$("$(bin sluice-host)" keygen --show --out "$pki/hosts/$id/host.nk")
    echo "sluice host add $id --group $name --nkey $key" >>"$out/register-hosts.sh"
  done
  secret "$release-host-$name" "${files[@]}" >>"$out/secrets.yaml"
done
printf '# make-secrets.sh: the gateway identity the NATS servers let in first.\ngateway:\n  nkeyPublic: %s\n' \
  "$gateway_key" >"$out/values-secrets.yaml"
echo "make-secrets.sh: wrote $out/secrets.yaml, $out/values-secrets.yaml and $out/register-hosts.sh"
echo "  kubectl create namespace $ns; kubectl apply -n $ns -f $out/secrets.yaml"
echo "  helm install $release deploy/helm/sluice -n $ns -f $out/values-secrets.yaml [-f your-values.yaml]"
echo "  then, with SLUICE_URL and SLUICE_ADMIN_TOKEN set: sh $out/register-hosts.sh"
