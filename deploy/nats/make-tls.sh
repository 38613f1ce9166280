#!/usr/bin/env bash
# Certificates for a Sluice NATS cluster, made with openssl.
#
#   make-tls.sh DIR [SAN]          a CA (ca.pem, ca-key.pem) and a server
#                                  certificate (server.pem, server-key.pem)
#                                  for SAN (default: DNS:localhost,IP:127.0.0.1)
#   make-tls.sh DIR client NAME    a client certificate NAME.pem / NAME-key.pem
#                                  signed by the CA in DIR (one per gateway and host)
#
# Existing files are kept (run it again to add clients). Keys are 0600.
set -euo pipefail
dir=${1:?usage: make-tls.sh DIR [SAN] | make-tls.sh DIR client NAME}
command -v openssl >/dev/null || { echo "make-tls.sh: openssl is missing (apt-get install openssl)" >&2; exit 1; }
mkdir -p "$dir"
umask 077
days=825

if [ "${2:-}" = client ]; then
  name=${3:?usage: make-tls.sh DIR client NAME}
  case "$name" in *[!A-Za-z0-9_-]*) echo "make-tls.sh: client name '$name': use letters, digits, '-' or '_'" >&2; exit 1 ;; esac
  [ -f "$dir/ca.pem" ] || { echo "make-tls.sh: no CA in $dir; run 'make-tls.sh $dir' first" >&2; exit 1; }
  if [ ! -f "$dir/$name.pem" ]; then
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=$name" \
      -keyout "$dir/$name-key.pem" -out "$dir/$name.csr" 2>/dev/null
    printf 'extendedKeyUsage=clientAuth\n' >"$dir/$name.ext"
    openssl x509 -req -in "$dir/$name.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
      -days $days -extfile "$dir/$name.ext" -out "$dir/$name.pem" 2>/dev/null
    rm -f "$dir/$name.csr" "$dir/$name.ext"
    chmod 644 "$dir/$name.pem"
    echo "make-tls.sh: client certificate $dir/$name.pem"
  fi
  exit 0
fi

san=${2:-DNS:localhost,IP:127.0.0.1}
if [ ! -f "$dir/ca.pem" ]; then
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days $days -subj "/CN=Sluice NATS CA" \
    -keyout "$dir/ca-key.pem" -out "$dir/ca.pem" 2>/dev/null
  chmod 644 "$dir/ca.pem"
  echo "make-tls.sh: CA $dir/ca.pem"
fi
if [ ! -f "$dir/server.pem" ]; then
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=sluice-nats" \
    -keyout "$dir/server-key.pem" -out "$dir/server.csr" 2>/dev/null
  printf 'subjectAltName=%s\nextendedKeyUsage=serverAuth,clientAuth\n' "$san" >"$dir/server.ext"
  openssl x509 -req -in "$dir/server.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca-key.pem" -CAcreateserial \
    -days $days -extfile "$dir/server.ext" -out "$dir/server.pem" 2>/dev/null
  rm -f "$dir/server.csr" "$dir/server.ext"
  chmod 644 "$dir/server.pem"
  echo "make-tls.sh: server certificate $dir/server.pem ($san)"
fi
