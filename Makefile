# Sluice — the two commands that matter are `make demo` and `make test`.
# Everything builds in release mode into one target/ so the (slow) wasmtime
# build is shared by demo, tests and benchmarks.

SHELL := /bin/bash
CARGO ?= cargo
NF_TARGET := wasm32-wasip2
NF_PROFILE := nf
NF_DIRS := $(patsubst nfs-wasm/%/Cargo.toml,%,$(wildcard nfs-wasm/*/Cargo.toml))
NF_OUT := target/nfs
TEST_NF_OUT := target/nfs-test
# The host is built with DPDK packet I/O; `make setup` installs libdpdk-dev.
FEATURES := --features sluice-host/dpdk
DEMO_DIR := target/demo
# nats-server for the cluster tests: the one on PATH, else the one `make
# setup` builds into Go's bin directory.
export SLUICE_NATS_SERVER ?= $(shell command -v nats-server 2>/dev/null || echo "$$(go env GOPATH 2>/dev/null)/bin/nats-server")

.PHONY: help setup build nfs test-nfs demo test lint unit fuzz-smoke fuzz bench images dist clean

help:
	@echo "make demo   - build everything, run a sample trace through firewall, IDS, monitor, NAT, NFs in C, Python, JS, Go, then the tenant flow (upload, deploy, usage, bill) on sluice dev, two tenants on one DPDK port, and a host group behind its dispatcher"
	@echo "make test   - lint, build the NFs, run every test (unit, integration, fuzz smoke)"
	@echo "make bench  - benchmarks; writes docs/benchmarks.md"
	@echo "make images - OCI images of the gateway and the host (target/images)"
	@echo "make dist   - the release tarball: binaries, WIT, every SDK (target/dist)"
	@echo "make setup  - install what the above need (idempotent)"

setup:
	@bash deploy/setup.sh

build: setup nfs
	$(CARGO) build --release --locked $(FEATURES)

# Every NF in nfs-wasm/<name>/ becomes target/nfs/<name>.wasm.
nfs: setup
	$(CARGO) build --locked --profile $(NF_PROFILE) --target $(NF_TARGET) $(foreach n,$(NF_DIRS),-p sluice-nf-$(n))
	@mkdir -p $(NF_OUT)
	@for n in $(NF_DIRS); do \
		cp target/$(NF_TARGET)/$(NF_PROFILE)/sluice_nf_$$(echo $$n | tr - _).wasm $(NF_OUT)/$$n.wasm; \
		echo "  $(NF_OUT)/$$n.wasm ($$(stat -c %s $(NF_OUT)/$$n.wasm) bytes)"; \
	done

# Test-only modules: the hostile NF, a component of the wrong world, and
# NFs built against the released sluice:nf@0.1.0, @0.2.0, @0.3.0, @0.4.0 and
# @0.5.0 contracts, one against @0.7.0 without an SDK (result frames, good
# and hostile), and a flow offload test NF.
test-nfs: setup
	$(CARGO) build --locked --profile $(NF_PROFILE) --target $(NF_TARGET) -p sluice-nf-hostile
	@mkdir -p $(TEST_NF_OUT)
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/sluice_nf_hostile.wasm $(TEST_NF_OUT)/hostile.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/wrong-world.wasm $(TEST_NF_OUT)/wrong-world.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/legacy-v0-1.wasm $(TEST_NF_OUT)/legacy-v0-1.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/legacy-v0-2.wasm $(TEST_NF_OUT)/legacy-v0-2.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/legacy-v0-3.wasm $(TEST_NF_OUT)/legacy-v0-3.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/legacy-v0-4.wasm $(TEST_NF_OUT)/legacy-v0-4.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/legacy-v0-5.wasm $(TEST_NF_OUT)/legacy-v0-5.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/frame-v0-7.wasm $(TEST_NF_OUT)/frame-v0-7.wasm
	@cp target/$(NF_TARGET)/$(NF_PROFILE)/offload-counter.wasm $(TEST_NF_OUT)/offload-counter.wasm

demo: build test-nfs
	@mkdir -p $(DEMO_DIR)
	@./target/release/sluice-host synth --out $(DEMO_DIR)/office.pcap --sessions 20000 --seed 7
	@echo
	@echo "== firewall -> counter over $(DEMO_DIR)/office.pcap (config: deploy/local/demo.toml)"
	@./target/release/sluice-host --config deploy/local/demo.toml run \
		--nf $(NF_OUT)/firewall.wasm,$(NF_OUT)/counter.wasm \
		--in $(DEMO_DIR)/office.pcap --out $(DEMO_DIR)/office.out.pcap \
		--report $(DEMO_DIR)/report.json
	@echo
	@echo "forwarded packets: $(DEMO_DIR)/office.out.pcap"
	@echo "per-NF meters and firewall deny events: $(DEMO_DIR)/report.json"
	@echo
	@echo "== the same trace with a misbehaving NF in the middle of the chain: each instance of it"
	@echo "   handles 100 batches, then spins forever. The 10 ms deadline stops it, fail-open lets"
	@echo "   that batch through, a new instance takes over, and the other NFs are unaffected."
	@./target/release/sluice-host --config deploy/local/demo-hostile.toml run \
		--nf $(NF_OUT)/firewall.wasm,$(TEST_NF_OUT)/hostile.wasm,$(NF_OUT)/counter.wasm \
		--in $(DEMO_DIR)/office.pcap --out $(DEMO_DIR)/office.hostile.out.pcap
	@echo
	@echo "== a branching chain (deploy/local/demo-chain.toml): the firewall labels web connections for"
	@echo "   the IDS and sends the rest to the monitor; both branches join at the egress counter"
	@./target/release/sluice-host --config deploy/local/demo-chain-host.toml run \
		--chain deploy/local/demo-chain.toml \
		--in $(DEMO_DIR)/office.pcap --out $(DEMO_DIR)/office.chain.out.pcap
	@echo
	@echo "== source NAT then the monitor on two workers (deploy/local/demo-nat.toml): connections from"
	@echo "   10.0.0.0/24 leave as 203.0.113.1 with ports from a pool the workers share; the monitor's"
	@echo "   per-host counters are merged across workers (report: $(DEMO_DIR)/nat-report.json)"
	@./target/release/sluice-host --config deploy/local/demo-nat.toml run \
		--nf $(NF_OUT)/nat.wasm,$(NF_OUT)/monitor.wasm \
		--in $(DEMO_DIR)/office.pcap --out $(DEMO_DIR)/office.nat.out.pcap \
		--report $(DEMO_DIR)/nat-report.json
	@echo
	@echo "== one firewall, four more languages: 'sluice nf new --template firewall' in C, Python, JavaScript and Go,"
	@echo "   'sluice nf test' (each built, checked against the contract, and run through its tests/basic case:"
	@echo "   eight packets written as text, one verdict each), then the office trace through each"
	@rm -rf $(DEMO_DIR)/langs && mkdir -p $(DEMO_DIR)/langs
	@for l in c python js go; do \
		$(CURDIR)/target/release/sluice nf new fw-$$l --lang $$l --template firewall --dir $(DEMO_DIR)/langs >/dev/null && \
		(cd $(DEMO_DIR)/langs/fw-$$l && out=$$($(CURDIR)/target/release/sluice nf test) && echo "$$out" | sed "s/^/   fw-$$l: /") || exit 1; \
	done
	@echo "   the case, fw-c/tests/basic/input.txt:"
	@sed 's/^/     /' $(DEMO_DIR)/langs/fw-c/tests/basic/input.txt
	@echo "   and its expected-verdicts.txt: $$(tr '\n' ',' < $(DEMO_DIR)/langs/fw-c/tests/basic/expected-verdicts.txt | sed 's/,$$//; s/,/, /g')"
	@echo "   'sluice nf run' runs each project on the office trace with its sluice.toml (config and limits):"
	@for l in c python js go; do \
		(cd $(DEMO_DIR)/langs/fw-$$l && $(CURDIR)/target/release/sluice nf run --in ../../office.pcap \
			--out ../fw-$$l.out.pcap 2>/dev/null | sed -n 2p) || exit 1; \
	done
	@cmp $(DEMO_DIR)/langs/fw-c.out.pcap $(DEMO_DIR)/langs/fw-python.out.pcap && \
		cmp $(DEMO_DIR)/langs/fw-c.out.pcap $(DEMO_DIR)/langs/fw-js.out.pcap && \
		cmp $(DEMO_DIR)/langs/fw-c.out.pcap $(DEMO_DIR)/langs/fw-go.out.pcap && \
		echo "identical output from C, Python, JavaScript and Go ($(DEMO_DIR)/langs/fw-*.out.pcap)"
	@echo
	@echo "== the tenant flow on the embedded default (sluice dev: gateway + one host in one process):"
	@echo "   create a tenant, upload the firewall, deploy it, push the trace, read the usage and the bill"
	@bash deploy/local/demo-tenant.sh $(DEMO_DIR)/office.pcap
	@echo
	@echo "== two tenants sharing one DPDK port through the gateway (deploy/local/demo-live.sh): a secure"
	@echo "   nats-server, the gateway, and sluice-host serve --dpdk on a net_pcap device replaying"
	@echo "   VLAN-tagged traffic; each tenant's NF sees and pays for its VLAN only. The gateway and the host export"
	@echo "   traces, metrics and logs over OTLP to an OpenTelemetry Collector and serve Prometheus metrics"
	@bash deploy/local/demo-live.sh
	@echo
	@echo "== a host group behind its dispatcher (deploy/local/demo-group.sh): the gateway's group controller"
	@echo "   keeps a flow-ownership table over three serve --dpdk hosts; sluice-host steer sends every flow"
	@echo "   to its owner over memif links; a drain and a kill -9 each give a new table version"
	@bash deploy/local/demo-group.sh
	@echo
	@echo "== the group under live traffic (sluice-bench --elastic-only): 240 firewall connections from a paced"
	@echo "   sender on a veth pair through the dispatcher; a standby host joins, one is drained, one is killed,"
	@echo "   then a drain whose flows pull their state; every frame's latency and loss, from the packets"
	@if [ "$$(id -u)" = 0 ] && command -v ip >/dev/null; then \
		./target/release/sluice-bench --nfs $(NF_OUT) --host target/release/sluice-host --elastic-only; \
	else echo "   skipped: the veth pairs need root and iproute2 (ip)"; fi
	@echo
	@echo "== observability: the live demo's run, as an operator sees it"
	@cat $(DEMO_DIR)/live/observability.txt

lint: setup
	$(CARGO) fmt --all --check
	python3 tests/lint/module_cycles.py
	python3 tests/lint/code_map.py --check
	@test -z "$$(gofmt -l sdk/go tests/conformance)" || { echo "gofmt: run gofmt -w on:"; gofmt -l sdk/go tests/conformance; exit 1; }
	$(CARGO) clippy --release --locked --workspace --all-targets $(FEATURES) -- -D warnings
	# Without DPDK too: the workspace build turns the feature on for every
	# crate, so only a per-package build shows what needs it.
	$(CARGO) clippy --release --locked -p sluice-engine -p sluice-agent -p sluice-host -p sluice-cli --all-targets -- -D warnings
	$(CARGO) clippy --release --locked --target $(NF_TARGET) $(foreach n,$(NF_DIRS),-p sluice-nf-$(n)) -p sluice-nf-hostile -- -D warnings

unit: nfs test-nfs
	SLUICE_NFS_DIR=$(CURDIR)/$(NF_OUT) SLUICE_TEST_NFS_DIR=$(CURDIR)/$(TEST_NF_OUT) \
		$(CARGO) test --release --locked --workspace $(FEATURES)

# Short coverage-guided fuzz runs of the packet parser, the capture
# reader, fragment reassembly and the batch and result frames (nightly +
# cargo-fuzz).
FUZZ_TARGETS := parse pcap fragments frames
fuzz-smoke: setup
	cd host/wire/fuzz && for t in $(FUZZ_TARGETS); do \
		$(CARGO) +nightly fuzz run $$t --release -- -max_total_time=$${FUZZ_SECONDS:-20} -rss_limit_mb=2048 || exit 1; \
	done

fuzz: setup
	cd host/wire/fuzz && for t in $(FUZZ_TARGETS); do \
		$(CARGO) +nightly fuzz run $$t --release -- -max_total_time=$${FUZZ_SECONDS:-600} || exit 1; \
	done

test: lint unit fuzz-smoke
	@echo "all tests passed"

# OCI images of the gateway and the host under target/images (umoci, no
# container daemon): deploy/images/build.sh.
images: build
	@bash deploy/images/build.sh target/images

# The release tarball: sluice-<version>-x86_64-linux.tar.gz (deploy/dist/build.sh).
dist: build
	@bash deploy/dist/build.sh target/dist

bench: build
	$(CARGO) run --release --locked -p sluice-bench -- --nfs $(NF_OUT) --host target/release/sluice-host --write docs/benchmarks.md

clean:
	$(CARGO) clean
