#!/usr/bin/env bash
# The DPDK benchmarks on a machine with neither Rust nor DPDK installed
# (a larger box lent for a scaling run, say).
#
#   host/bench/portable.sh pack BUNDLE.tgz
#       here, after `make build` and `make nfs`: packs stripped sluice-host
#       and sluice-bench, dpdk-testpmd, every library they load (with this
#       machine's glibc loader, so the target's own libc does not matter),
#       the four PMDs the benchmarks use and the NFs.
#   host/bench/portable.sh run BUNDLE.tgz [SECTION ...]
#       there, as root: unpacks under /opt (EAL refuses plugins below a
#       world-writable directory such as /tmp), links the PMDs into EAL's
#       plugin directory and runs `sluice-bench --SECTION-only` for each
#       SECTION (default: stages dpdk), writing SECTION.md and SECTION.err
#       to $OUT (default: the current directory). Each row of the scaling
#       table is printed to SECTION.err as it is measured. BENCH_ARGS adds
#       flags to every section's command (e.g. "--dpdk-workers 1,16").
set -euo pipefail

PMDS="bus_vdev mempool_ring mempool_stack net_pcap net_null"
PLUGINS=/usr/lib/x86_64-linux-gnu/dpdk/pmds-23.0

pack() {
    local out=$1 top tmp b
    top=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
    tmp=$(mktemp -d)
    b=$tmp/sluice-bench-bundle
    mkdir -p "$b"/{bin,lib,real,pmds,nfs}
    for f in sluice-host sluice-bench; do
        [ -x "$top/target/release/$f" ] || { echo "target/release/$f is missing: run make build" >&2; exit 1; }
        strip -o "$b/real/$f" "$top/target/release/$f"
    done
    cp "$(command -v dpdk-testpmd)" "$b/real/" || { echo "dpdk-testpmd is missing: run make setup" >&2; exit 1; }
    for m in $PMDS; do cp -L "$PLUGINS/librte_$m.so.23.0" "$b/pmds/"; done
    for nf in noop firewall nat monitor; do cp "$top/target/nfs/$nf.wasm" "$b/nfs/"; done
    for x in "$b"/real/* "$b"/pmds/*; do ldd "$x" | awk '/=>/ {print $3} /ld-linux/ {print $1}'; done |
        sort -u | while read -r l; do [ -f "$l" ] && cp -L "$l" "$b/lib/"; done
    cp -L /lib64/ld-linux-x86-64.so.2 "$b/lib/"
    cp -L /usr/libexec/coreutils/libstdbuf.so "$b/lib/"
    for n in sluice-host sluice-bench dpdk-testpmd; do
        # stdbuf (which the benchmark runs testpmd under) preloads its
        # library: give it the bundle's, built for the bundle's libc.
        cat > "$b/bin/$n" <<EOF
#!/usr/bin/env bash
D=\$(cd "\$(dirname "\${BASH_SOURCE[0]}")/.." && pwd)
if [ -n "\${_STDBUF_O:-}" ]; then export LD_PRELOAD=\$D/lib/libstdbuf.so; else unset LD_PRELOAD; fi
exec "\$D/lib/ld-linux-x86-64.so.2" --library-path "\$D/lib" "\$D/real/$n" "\$@"
EOF
        chmod +x "$b/bin/$n"
    done
    tar -C "$tmp" -czf "$out" sluice-bench-bundle
    rm -rf "$tmp"
    echo "packed $(du -h "$out" | cut -f1) into $out"
}

run() {
    local bundle=$1 dir=/opt/sluice-bench-bundle d start
    shift
    rm -rf "$dir"
    mkdir -p "$dir"
    tar -C "$dir" -xzf "$bundle"
    d=$dir/sluice-bench-bundle
    mkdir -p "$PLUGINS"
    for m in $PMDS; do
        # A PMD testpmd links too is linked to that same file, so it is
        # never loaded twice.
        if [ -f "$d/lib/librte_$m.so.23" ]; then
            ln -sf "$d/lib/librte_$m.so.23" "$PLUGINS/librte_$m.so.23.0"
        else
            cp "$d/pmds/librte_$m.so.23.0" "$PLUGINS/"
        fi
    done
    export PATH=$d/bin:$PATH
    echo "$(nproc) CPUs; $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2)"
    local out=${OUT:-$PWD}
    cd "$dir"
    for s in "${@:-stages dpdk}"; do
        for section in $s; do
            start=$(date +%s)
            # shellcheck disable=SC2086 # BENCH_ARGS is a list of flags
            sluice-bench --nfs "$d/nfs" --host "$d/bin/sluice-host" "--$section-only" ${BENCH_ARGS:-} \
                >"$out/$section.md" 2>"$out/$section.err" || true
            echo "$section: $(($(date +%s) - start)) s"
            tail -n 3 "$out/$section.err"
        done
    done
}

case "${1:-}" in
    pack) pack "${2:?give the path of the bundle}" ;;
    run) run "${2:?give the path of the bundle}" "${@:3}" ;;
    *) echo "usage: $0 pack BUNDLE.tgz | run BUNDLE.tgz [SECTION ...]" >&2; exit 2 ;;
esac
