#!/usr/bin/env bash
# Credentials and certificates of a Sluice cluster's control plane.
#
#   bootstrap.sh DIR [SAN]       the CA, the NATS servers' certificate (for
#                                SAN, default DNS:localhost,IP:127.0.0.1), and
#                                the gateway's client certificate and nkey seed
#   bootstrap.sh DIR host ID     a host's client certificate and nkey seed under
#                                DIR/hosts/ID/ (copy them to the host), and the
#                                command that registers it with the gateway
#
# Needs openssl, and sluice-gateway / sluice-host on PATH (or SLUICE_BIN=dir).
# Existing files are kept: running it again is safe. Secrets are mode 0600.
set -euo pipefail
dir=${1:?usage: bootstrap.sh DIR [SAN] | bootstrap.sh DIR host ID}
here=$(cd "$(dirname "$0")" && pwd)
bin() {
  if [ -n "${SLUICE_BIN:-}" ]; then echo "$SLUICE_BIN/$1"
  elif command -v "$1" >/dev/null; then command -v "$1"
  elif [ -x "$here/../../target/release/$1" ]; then echo "$here/../../target/release/$1"
  else echo "bootstrap.sh: $1 not found; build it (make build) or set SLUICE_BIN" >&2; exit 1
  fi
}
mkdir -p "$dir"

if [ "${2:-}" = host ]; then
  id=${3:?usage: bootstrap.sh DIR host ID}
  out="$dir/hosts/$id"
  mkdir -p "$out"
  "$here/make-tls.sh" "$dir/tls" client "$id" >/dev/null
  cp "$dir/tls/ca.pem" "$dir/tls/$id.pem" "$out/"
  cp "$dir/tls/$id-key.pem" "$out/" && chmod 600 "$out/$id-key.pem"
  [ -f "$out/host.nk" ] || "$(bin sluice-host)" keygen --out "$out/host.nk" >/dev/null
  key=$("$(bin sluice-host)" keygen --show --out "$out/host.nk")
  echo "host $id: $out (host.nk, $id.pem, $id-key.pem, ca.pem); on the host:"
  echo "  sluice-host serve --host-id $id --nats-nkey host.nk --nats-ca ca.pem --nats-cert $id.pem --nats-key $id-key.pem ..."
  echo "register it (then reload nats-server unless the systemd path unit does):"
  echo "  sluice host add $id --group <group> --nkey $key"
  exit 0
fi

"$here/make-tls.sh" "$dir/tls" "${2:-DNS:localhost,IP:127.0.0.1}"
"$here/make-tls.sh" "$dir/tls" client gateway
[ -f "$dir/gateway.nk" ] || "$(bin sluice-gateway)" keygen --out "$dir/gateway.nk" >/dev/null
cat <<MSG
bootstrap.sh: done. In the gateway's config:
  nats-nkey = "$dir/gateway.nk"
  nats-ca = "$dir/tls/ca.pem"
  nats-cert = "$dir/tls/gateway.pem"
  nats-key = "$dir/tls/gateway-key.pem"
  nats-auth-file = "/etc/nats/sluice-auth.conf"
then write the servers' authorization block once, before nats-server starts:
  sluice-gateway --config gateway.toml nats-auth
and give nats-server $dir/tls/{ca,server,server-key}.pem (deploy/nats/nats-server.conf).
MSG
