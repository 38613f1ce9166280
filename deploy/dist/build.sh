#!/usr/bin/env bash
# The release tarball (`make dist`): sluice-<version>-x86_64-linux.tar.gz
# under target/dist, for machines without a Sluice checkout:
#
#   bin/sluice, bin/sluice-host, bin/sluice-gateway     (stripped)
#   share/sluice/wit/                                   the sluice:nf WIT packages
#   share/sluice/sdk/{rust,c,python,js,go}/             every SDK, standalone
#                                                       (the Rust SDK with the crates
#                                                       it uses in sdk/rust/vendor/)
#   share/sluice/python/sluice_nf-<version>-py3-none-any.whl   pip install it
#   share/sluice/js/sluice-nf-<version>.tgz            npm install it
#   share/doc/sluice/                                   the documentation, laid out as
#                                                       in the repository: README.md,
#                                                       docs/, sdk/*/README.md, wit/,
#                                                       nfs-wasm/*/README.md, the
#                                                       conformance cases (every NF
#                                                       example in five languages) and
#                                                       deploy/'s example configurations
#   README.md
#
# A path a document names (`docs/run-report.md`, `tests/conformance/guard`)
# is found under share/doc/sluice/; sdk/cli/tests/dist.rs checks that every
# path the tenant documentation and the binaries' --help name is there.
# `sluice` finds share/sluice beside its bin/ and installs the SDK a
# project needs under the user's data directory on first use. sluice-host
# links DPDK 22.11's shared libraries (Debian 12: apt install dpdk).
set -euo pipefail
out=${1:-target/dist}
B=${SLUICE_BIN:-target/release}
for b in sluice sluice-host sluice-gateway; do
  [ -x "$B/$b" ] || { echo "dist: $B/$b is missing: make build first" >&2; exit 1; }
done
command -v npm >/dev/null || { echo "dist: npm is missing (apt install npm, or make setup)" >&2; exit 1; }
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
name="sluice-$version-x86_64-linux"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
root="$work/$name"
mkdir -p "$root/bin" "$root/share" "$out"

for b in sluice sluice-host sluice-gateway; do
  cp "$B/$b" "$root/bin/"
  strip "$root/bin/$b"
done
# The standalone SDK, as the CLI installs it for projects.
"$B/sluice" --sdk-root . sdk install --to "$root/share/sluice" >/dev/null
mkdir -p "$root/share/sluice/python" "$root/share/sluice/js"
# The Python SDK as a wheel, the JavaScript SDK as an npm package.
# (from a copy: the build leaves its build/ and egg-info beside the sources)
cp -r sdk/python "$work/python-src"
python3 -m pip wheel -q --no-deps -w "$root/share/sluice/python" "$work/python-src" 2>"$work/pip.log" || {
  cat "$work/pip.log" >&2
  echo "dist: building the Python wheel failed (pip wheel sdk/python)" >&2
  exit 1
}
(cd sdk/js && npm pack --silent --pack-destination "$root/share/sluice/js" >/dev/null)
# The documentation, as the repository lays it out.
doc="$root/share/doc/sluice"
mkdir -p "$doc"
cp README.md "$doc/"
cp -r docs "$doc/docs"
for d in sdk/*/; do
  [ -f "$d/README.md" ] && mkdir -p "$doc/$d" && cp "$d/README.md" "$doc/$d"
done
for d in nfs-wasm/*/; do
  [ -f "$d/README.md" ] && mkdir -p "$doc/$d" && cp "$d/README.md" "$doc/$d"
done
cp -r wit "$doc/wit"
mkdir -p "$doc/tests"
cp -r tests/conformance "$doc/tests/conformance"
mkdir -p "$doc/deploy"
for d in local nats systemd prometheus grafana otel; do
  cp -r "deploy/$d" "$doc/deploy/$d"
done
cp README.md "$root/"
tar -C "$work" -czf "$out/$name.tar.gz" "$name"
echo "dist: $out/$name.tar.gz ($(du -h "$out/$name.tar.gz" | cut -f1))"
