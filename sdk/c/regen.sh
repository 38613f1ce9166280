#!/usr/bin/env bash
# Regenerates gen/ from the contract with wit-bindgen's C generator. The
# output is committed so building a C NF needs only clang + wasi-libc;
# run this after a contract change (cargo install --locked wit-bindgen-cli@0.60.0,
# the version the Rust SDK uses).
set -euo pipefail
cd "$(dirname "$0")"
wit-bindgen c ../../wit/v0.6.0 --world network-function --out-dir gen
