#!/usr/bin/env bash
# OCI images of the gateway and the host, built without a container daemon
# (`make images`): each is a root filesystem holding the binary, the shared
# libraries it links (and, for the host, DPDK's drivers for virtual devices
# and common NICs), CA certificates and an unprivileged user (65532), packed
# by umoci into an OCI image layout under target/images/<name>, tagged with
# the workspace version. Push one with
#   skopeo copy oci:target/images/sluice-gateway:<version> docker://<registry>/sluice-gateway:<version>
set -euo pipefail
out=${1:-target/images}
B=${SLUICE_BIN:-target/release}
command -v umoci >/dev/null || { echo "images: umoci not found: make setup installs it (Debian package umoci)" >&2; exit 1; }
for b in sluice-gateway sluice-host; do
  [ -x "$B/$b" ] || { echo "images: $B/$b is missing: make build first" >&2; exit 1; }
done
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

# Copies a file to the same path under a root filesystem, with the chain
# of symbolic links that leads to it (the loader then sees one library
# under its several names, as on the build machine).
put() {
  local root=$1 f=$2 t
  while :; do
    mkdir -p "$root$(dirname "$f")"
    if [ -L "$f" ]; then
      cp -P "$f" "$root$f"
      t=$(readlink "$f")
      case $t in /*) f=$t ;; *) f=$(dirname "$f")/$t ;; esac
    else
      cp "$f" "$root$f"
      return
    fi
  done
}
# Every library a binary or shared object links, at its path.
libs_of() {
  ldd "$2" | awk '/=>/ { print $3 } /^[[:space:]]*\/lib/ { print $1 }' | grep '^/' | while read -r lib; do put "$1" "$lib"; done
}
# A binary at /usr/local/bin, stripped, with its libraries.
binary() {
  mkdir -p "$1/usr/local/bin"
  cp "$2" "$1/usr/local/bin/"
  strip "$1/usr/local/bin/$(basename "$2")"
  libs_of "$1" "$2"
}
# What every image has: the user the process runs as, CA certificates
# (NATS over TLS, OTLP over HTTPS), /tmp, the state directory.
base() {
  local root=$1
  # Merged /usr, as on Debian: /lib and /lib64 are /usr's.
  mkdir -p "$root/etc" "$root/tmp" "$root/var/lib/sluice" "$root/usr/lib" "$root/usr/lib64" "$root/proc" "$root/sys" "$root/dev"
  ln -s usr/lib "$root/lib"
  ln -s usr/lib64 "$root/lib64"
  chmod 1777 "$root/tmp"
  printf 'root:x:0:0:root:/root:/sbin/nologin\nsluice:x:65532:65532:sluice:/var/lib/sluice:/sbin/nologin\n' >"$root/etc/passwd"
  printf 'root:x:0:\nsluice:x:65532:\n' >"$root/etc/group"
  put "$root" /etc/ssl/certs/ca-certificates.crt
  chown 65532:65532 "$root/var/lib/sluice"
}

gateway_rootfs() {
  base "$1"
  binary "$1" "$B/sluice-gateway"
}

# DPDK drivers the host image carries: virtual devices (af_packet, pcap,
# memif, null, ring, vhost, tap) and common paravirtual and Intel NICs.
pmd_dir=$(ls -d /usr/lib/x86_64-linux-gnu/dpdk/pmds-* 2>/dev/null | head -1 || true)
pmds=(bus_vdev bus_pci mempool_ring mempool_stack net_af_packet net_pcap net_memif net_null net_ring net_vhost net_tap
  net_virtio net_e1000 net_ixgbe net_i40e net_ice net_iavf net_ena net_vmxnet3)
host_rootfs() {
  local root=$1
  base "$root"
  binary "$root" "$B/sluice-host"
  [ -n "$pmd_dir" ] || { echo "images: no DPDK driver directory (libdpdk-dev)" >&2; exit 1; }
  mkdir -p "$root$pmd_dir" "$root/var/run/dpdk"
  chown 65532:65532 "$root/var/run/dpdk"
  # The EAL loads every driver in its directory at start.
  for p in "${pmds[@]}"; do
    if [ -e "$pmd_dir/librte_$p.so" ]; then
      put "$root" "$pmd_dir/librte_$p.so"
      libs_of "$root" "$pmd_dir/librte_$p.so"
    fi
  done
}

# image <name> <populate function> <umoci config flags...>
image() {
  local name=$1 populate=$2
  shift 2
  local layout="$out/$name" bundle="$work/$name"
  rm -rf "$layout"
  umoci init --layout "$layout"
  umoci new --image "$layout:$version"
  umoci unpack --image "$layout:$version" "$bundle" >/dev/null
  "$populate" "$bundle/rootfs"
  umoci repack --image "$layout:$version" "$bundle"
  umoci config --image "$layout:$version" --author "Sluice" \
    --config.label "org.opencontainers.image.title=$name" \
    --config.label "org.opencontainers.image.version=$version" "$@"
  umoci gc --layout "$layout"
  echo "images: $layout:$version ($(du -sh "$layout" | cut -f1))"
}

image sluice-gateway gateway_rootfs \
  --config.entrypoint /usr/local/bin/sluice-gateway --config.user 65532:65532 \
  --config.workingdir /var/lib/sluice --config.volume /var/lib/sluice \
  --config.env HOME=/var/lib/sluice --config.env SLUICE_DATA_DIR=/var/lib/sluice --config.env SLUICE_LISTEN=0.0.0.0:8080 \
  --config.exposedports 8080/tcp --config.exposedports 9464/tcp
image sluice-host host_rootfs \
  --config.entrypoint /usr/local/bin/sluice-host --config.cmd serve --config.user 65532:65532 \
  --config.workingdir /var/lib/sluice --config.volume /var/lib/sluice \
  --config.env HOME=/var/lib/sluice --config.env SLUICE_STATE_DIR=/var/lib/sluice --config.exposedports 9464/tcp
