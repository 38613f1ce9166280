//! Integration tests: real components built from `nfs-wasm/` and
//! `tests/nfs/` through the real runtime and host. One test binary for
//! faster links. Run through `make test`, which builds the components first.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing)]

mod chain;
mod conformance;
mod cores;
mod directions;
mod dns;
mod firewall;
mod hostile;
mod ids;
mod lb;
mod modules;
mod monitor;
mod nat;
mod offload;
mod pcap_input;
mod policing;
mod swap;
mod tables;
