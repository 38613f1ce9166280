//! Built without the `dpdk` feature, `tests/dpdk.rs` and
//! `tests/realstack.rs` compile to nothing: this says so in the test
//! output instead of passing in silence.

#![cfg(not(feature = "dpdk"))]

#[test]
#[ignore = "the DPDK and real-stack tests were skipped: built without the dpdk feature; run `cargo test --features sluice-host/dpdk` (`make test` does)"]
fn dpdk_and_real_stack_tests_need_the_dpdk_feature() {}
