//! The gateway's integration tests, one binary: real gateway, host and
//! nats-server processes (and Prometheus, the OTel Collector, Helm, a
//! browser, where a test says so). `cargo test -p sluice-gateway --test all
//! <module>::` runs one file's tests.

mod support;

mod api_contract;
mod attachments;
mod cluster;
mod dashboard;
mod durability;
mod groups;
mod helm;
mod images;
mod limits;
mod live;
mod logs;
mod nats_cluster;
mod observability;
mod operator_mode;
mod realstack_live;
mod restart;
mod trust;
