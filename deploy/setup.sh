#!/usr/bin/env bash
# Installs what `make demo`, `make test` and `make bench` need. Idempotent:
# it checks before installing and says what it did. Needs network access to
# Debian, crates.io and the Rust toolchain server on a fresh machine.
set -euo pipefail

did=()
say() { echo "setup: $*"; }
need_root() { if [ "$(id -u)" -ne 0 ]; then echo "sudo"; fi; }

# Debian packages: a C toolchain (wasmtime's build scripts), pkg-config,
# DPDK 22.11 (libdpdk-dev for the host's DPDK I/O, dpdk-dev for the
# dpdk-testpmd forwarding baseline of the benchmarks), openssl (the NATS
# certificates of deploy/nats/make-tls.sh), tshark (the NAT test
# validates rewritten checksums with it), and the guest toolchains of the
# SDKs: clang + lld + wasi-libc for C, Node.js + npm for JavaScript, Python
# with pip for Python; chromium for the dashboard test; prometheus for the
# observability test; umoci for the OCI images (`make images`); iproute2,
# ethtool, iputils-ping and iperf3 for the real-stack test (Linux TCP/UDP/
# ICMP in network namespaces through the host) and its benchmark.
apt_pkgs=(build-essential pkg-config curl ca-certificates openssl libdpdk-dev dpdk-dev tshark
  clang lld wasi-libc libclang-rt-14-dev-wasm32 chromium prometheus umoci
  iproute2 ethtool iputils-ping iperf3)
command -v node >/dev/null || apt_pkgs+=(nodejs)
command -v npm >/dev/null || apt_pkgs+=(npm)
command -v python3 >/dev/null || apt_pkgs+=(python3)
python3 -m pip --version >/dev/null 2>&1 || apt_pkgs+=(python3-pip)
missing=()
for p in "${apt_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  if command -v apt-get >/dev/null; then
    $(need_root) apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $(need_root) apt-get install -y -qq "${missing[@]}"
    did+=("apt: ${missing[*]}")
  else
    echo "setup: missing packages ${missing[*]} and no apt-get; install them by hand" >&2
    exit 1
  fi
fi

# Rust: rustup, the pinned toolchain with the wasm target (rust-toolchain.toml).
if ! command -v rustup >/dev/null; then
  if [ -x "$HOME/.cargo/bin/rustup" ]; then
    export PATH="$HOME/.cargo/bin:$PATH"
  else
    echo "setup: rustup not found; install it from https://rustup.rs (or your distribution) and re-run" >&2
    exit 1
  fi
fi
channel=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml)
if ! rustup toolchain list | grep -q "^$channel"; then
  rustup toolchain install "$channel" --profile minimal -c rustfmt -c clippy -t wasm32-wasip2
  did+=("rust $channel")
fi
if ! rustup target list --installed --toolchain "$channel" | grep -q '^wasm32-wasip2$'; then
  rustup target add wasm32-wasip2 --toolchain "$channel"
  did+=("target wasm32-wasip2")
fi
for c in rustfmt clippy; do
  if ! rustup component list --installed --toolchain "$channel" | grep -q "^$c"; then
    rustup component add "$c" --toolchain "$channel"
    did+=("component $c")
  fi
done

# Fuzzing: a nightly toolchain and cargo-fuzz.
if ! rustup toolchain list | grep -q '^nightly'; then
  rustup toolchain install nightly --profile minimal
  did+=("rust nightly")
fi
if ! cargo +nightly fuzz --version >/dev/null 2>&1; then
  cargo install --locked cargo-fuzz
  did+=("cargo-fuzz")
fi

# Python SDK: componentize-py from PyPI, pinned (it embeds the CPython it
# builds NFs with).
# pip_pinned TOOL VERSION INSTALLED: installs TOOL==VERSION from PyPI unless
# INSTALLED (the version the tool reports) is that one; the tool must then
# be on PATH.
pip_pinned() {
  if [ "$3" != "$2" ]; then
    python3 -m pip install -q "$1==$2" 2>/dev/null || python3 -m pip install -q --break-system-packages "$1==$2"
    did+=("$1 $2")
  fi
  if ! command -v "$1" >/dev/null; then
    echo "setup: $1 was installed but is not on PATH; add Python's script directory to PATH" >&2
    exit 1
  fi
}
componentize_py=0.25.1
pip_pinned componentize-py "$componentize_py" "$(componentize-py --version 2>/dev/null | awk '{print $2}')"

# Go SDK: Go 1.24 or newer (//go:wasmexport). Debian 12's golang is 1.19,
# so this one is not installed here.
if ! go_version=$(go env GOVERSION 2>/dev/null); then
  echo "setup: Go NFs (sdk/go, the conformance suite) need Go 1.24 or newer on PATH; install it from go.dev/dl" >&2
  exit 1
fi
go_minor=$(echo "$go_version" | sed -n 's/^go1\.\([0-9]*\).*/\1/p')
if [ -z "$go_minor" ] || [ "$go_minor" -lt 24 ]; then
  echo "setup: $go_version is too old for Go NFs (//go:wasmexport needs Go 1.24 or newer); install a newer Go from go.dev/dl" >&2
  exit 1
fi

# JavaScript SDK: componentize-js and esbuild from npm, at the versions in
# sdk/js/package-lock.json.
if [ ! -x sdk/js/node_modules/.bin/componentize-js ] || [ ! -x sdk/js/node_modules/.bin/esbuild ] ||
  [ sdk/js/package-lock.json -nt sdk/js/node_modules/.package-lock.json ]; then
  (cd sdk/js && npm install --no-audit --no-fund --loglevel=error)
  did+=("npm: sdk/js")
fi

# Prometheus (Debian's package, above) scrapes the gateway and a host in
# the observability test; its own service is not started.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  $(need_root) systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

# NATS: the control plane needs nats-server 2.10 or newer (JetStream KV and
# object store as async-nats uses them; Debian 12 ships 2.9). Built from the
# Go module proxy into $(go env GOPATH)/bin when missing or too old.
nats_version=2.12.8
nats_ok() {
  local v
  v=$("$1" --version 2>/dev/null | sed -n 's/^nats-server: v\([0-9]*\)\.\([0-9]*\).*/\1 \2/p')
  [ -n "$v" ] && { set -- $v; [ "$1" -gt 2 ] || { [ "$1" -eq 2 ] && [ "$2" -ge 10 ]; }; }
}
gobin="$(go env GOPATH)/bin"
if ! { command -v nats-server >/dev/null && nats_ok "$(command -v nats-server)"; } && ! nats_ok "$gobin/nats-server"; then
  GOFLAGS=-mod=mod go install "github.com/nats-io/nats-server/v2@v$nats_version"
  did+=("nats-server $nats_version ($gobin)")
fi

# An OpenTelemetry Collector (OTLP in, files out) for the export test and
# the demo: built once with the collector builder from deploy/otel/builder.yaml.
otel_version=0.161.0
if [ ! -x "$gobin/otelcol-sluice" ] || [ deploy/otel/builder.yaml -nt "$gobin/otelcol-sluice" ]; then
  if [ ! -x "$gobin/builder" ] || ! "$gobin/builder" version 2>/dev/null | grep -q "$otel_version"; then
    GOFLAGS=-mod=mod go install "go.opentelemetry.io/collector/cmd/builder@v$otel_version"
  fi
  work=$(mktemp -d)
  cp deploy/otel/builder.yaml "$work/"
  (cd "$work" && "$gobin/builder" --config builder.yaml >"$work/build.log" 2>&1) || {
    echo "setup: building the OpenTelemetry Collector failed; see $work/build.log" >&2
    exit 1
  }
  install -m 0755 "$work/otelcol-sluice/otelcol-sluice" "$gobin/otelcol-sluice"
  rm -rf "$work"
  did+=("otelcol-sluice $otel_version ($gobin)")
fi

# The Helm chart test: helm renders and lints deploy/helm/sluice,
# kubernetes-validate checks what it renders against Kubernetes' schemas
# (offline, from the schemas it ships).
helm_version=3.22.0
if ! go version -m "$gobin/helm" 2>/dev/null | grep -q "mod[[:space:]]*helm.sh/helm/v3[[:space:]]*v$helm_version"; then
  GOFLAGS=-mod=mod go install "helm.sh/helm/v3/cmd/helm@v$helm_version"
  did+=("helm $helm_version ($gobin)")
fi
pip_pinned kubernetes-validate 1.37.0 "$(kubernetes-validate --version 2>/dev/null | awk '{print $NF}')"
# The API contract test (gateway/tests/api_contract.rs) runs Schemathesis
# against a `sluice dev`'s /openapi.json.
pip_pinned schemathesis 4.32.5 "$(schemathesis --version 2>/dev/null | awk '{print $NF}')"

# The dashboard test drives Debian's chromium with playwright-core (npm).
if [ ! -d tests/dashboard/node_modules/playwright-core ] ||
  [ tests/dashboard/package.json -nt tests/dashboard/node_modules/.package-lock.json ]; then
  (cd tests/dashboard && npm install --no-audit --no-fund --loglevel=error)
  did+=("npm: tests/dashboard")
fi

if [ ${#did[@]} -eq 0 ]; then
  say "everything already installed"
else
  say "installed: ${did[*]}"
fi
