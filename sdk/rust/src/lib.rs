//! Write Sluice network functions in Rust.
//!
//! An NF is a type that implements [`NetworkFunction`] and is exported with
//! [`export_nf!`]. The host calls [`NetworkFunction::init`] once per instance
//! with the tenant's configuration and [`NetworkFunction::process`] once per
//! batch of packets. Inside `process`, [`Batch`] gives typed views of every
//! packet, the per-flow state the host handed in with the batch, and setters
//! for verdicts, rewrites and state changes — none of which calls the host,
//! so a batch costs one call however many packets it holds.
//!
//! ```
//! use sluice_sdk::{Batch, NetworkFunction, NfInfo, Verdict};
//!
//! /// Drops every UDP packet to port 53, forwards the rest.
//! struct NoDns;
//!
//! impl NetworkFunction for NoDns {
//!     fn init(_config: &[u8]) -> Result<(Self, NfInfo), String> {
//!         Ok((NoDns, NfInfo::stateless()))
//!     }
//!
//!     fn process(&mut self, batch: &mut Batch) -> Result<(), String> {
//!         for i in 0..batch.len() {
//!             let dns = batch.packet(i).and_then(|p| p.udp()).is_some_and(|u| u.dst_port() == 53);
//!             if dns {
//!                 batch.set_verdict(i, Verdict::Drop);
//!             }
//!         }
//!         Ok(())
//!     }
//! }
//!
//! sluice_sdk::export_nf!(NoDns);
//! # fn main() {}
//! ```
//!
//! The same type also runs natively (the host's benchmarks call NFs this way
//! to measure what the sandbox costs): build a [`Batch`] with
//! [`Batch::new`] (or [`Batch::from_frame`]) and call `process` directly.

#![deny(missing_docs)]

mod batch;
pub mod matchers;
pub mod offload;
mod packet;
pub mod state;

pub use batch::Batch;
pub use packet::Packet;
pub use sluice_wire as wire;
pub use sluice_wire::{FlowKey, IpAddr128};

/// The component's heap (feature `talc`, on by default): every call
/// allocates the batch frame (the host lowers it through the guest's
/// allocator) and the verdicts it returns, and frees both afterwards; talc
/// does that in fewer instructions than the standard library's allocator.
#[cfg(all(feature = "talc", target_arch = "wasm32", not(target_feature = "atomics")))]
#[global_allocator]
static HEAP: talc::wasm::WasmDynamicTalc = talc::wasm::new_wasm_dynamic_allocator();

/// The generated `sluice:nf` bindings. Not part of the SDK's stable API:
/// use the re-exports at the crate root.
// SAFETY: the unsafe code here is wit-bindgen's generated canonical-ABI
// glue (reading and writing guest memory the host laid out); none is
// written by hand.
#[doc(hidden)]
#[allow(unsafe_code, missing_docs, clippy::all)]
pub mod wit {
    wit_bindgen::generate!({
        path: "../../wit/v0.6.0",
        world: "network-function",
        pub_export_macro: true,
        export_macro_name: "__export_network_function",
        default_bindings_module: "::sluice_sdk::wit",
    });
}

pub use sluice_wire::abi::Verdict;
pub use wit::sluice::nf::types::{BatchResult, Event, FlowUpdate, Level, NfInfo, Rewrite, StateOp};

/// The SDK version, recorded in every component built with it (see the
/// `sluice-sdk-version` custom section) so a host can tell which SDK an NF
/// came from.
pub const SDK_VERSION: &str = env!("CARGO_PKG_VERSION");

// SAFETY: `link_section` only names the custom section the bytes go to;
// nothing reads or writes this static at run time.
#[cfg(target_arch = "wasm32")]
#[unsafe(link_section = "sluice-sdk-version")]
#[used]
#[allow(unsafe_code)]
static SDK_VERSION_SECTION: [u8; SDK_VERSION.len()] = match SDK_VERSION.as_bytes().first_chunk() {
    Some(bytes) => *bytes,
    None => [0; SDK_VERSION.len()],
};

impl NfInfo {
    /// An NF that keeps no per-flow state: the host skips state lookups.
    pub fn stateless() -> Self {
        NfInfo { wants_flow_state: false, flow_idle_timeout_ns: 0 }
    }

    /// An NF that wants its per-flow state with every batch; state idles out
    /// after `idle_timeout_ns` of packet time without traffic (0: the host's
    /// default).
    pub fn with_flow_state(idle_timeout_ns: u64) -> Self {
        NfInfo { wants_flow_state: true, flow_idle_timeout_ns: idle_timeout_ns }
    }
}

/// A network function.
///
/// `init` runs once per instance (again after a trap re-created the
/// instance); `process` runs once per batch. Both run inside the sandbox:
/// panics become traps, which the host contains.
pub trait NetworkFunction: Sized + 'static {
    /// Parses the tenant's configuration. Return `Err` with a message that
    /// says what is wrong and where; the host shows it verbatim.
    fn init(config: &[u8]) -> Result<(Self, NfInfo), String>;

    /// Decides every packet of the batch. Packets default to
    /// `Verdict::Forward(0)`; set others with [`Batch::set_verdict`].
    /// Returning `Err` applies the NF's failure policy to the whole batch.
    fn process(&mut self, batch: &mut Batch) -> Result<(), String>;

    /// Entries the host removed from `table` for idleness (tables declared
    /// with [`notify_expired`](state::TableSpec::notify_expired)): framed
    /// key, value, key, value, ... (see [`state::frames`]). Per-flow keys
    /// are [`FlowKey::to_bytes`]. Called after `process`; state calls are
    /// allowed (e.g. releasing a NAT port).
    fn expired(&mut self, table: state::Table, entries: &[u8]) -> Result<(), String> {
        let _ = (table, entries);
        Ok(())
    }
}

/// The value of `key` in a configuration of `key=value` lines (spaces
/// around both ignored, `#` starts a comment line): the simple format every
/// SDK reads the same way. NFs with richer configuration parse JSON or
/// TOML themselves.
pub fn config_value<'a>(config: &'a str, key: &str) -> Option<&'a str> {
    config.lines().map(str::trim).filter(|l| !l.starts_with('#')).find_map(|l| {
        let (k, v) = l.split_once('=')?;
        (k.trim() == key).then(|| v.trim())
    })
}

/// The value of `key` as a string, or `default` when the configuration
/// has no such key (an empty value, `key =`, is the empty string).
pub fn config_str<'a>(config: &'a str, key: &str, default: &'a str) -> &'a str {
    config_value(config, key).unwrap_or(default)
}

/// The value of `key` as a signed 64-bit integer, or `default` when the
/// configuration has no such key. The value is decimal digits with an
/// optional sign (`-12`, `+7`, `30000`); nothing else is accepted, so every
/// SDK reads the same configuration the same way.
///
/// Errors: a message naming the key and its value (`"capacity = 12k: not an
/// integer"`, `"... : integer out of range"`), ready to return from `init`.
pub fn config_int(config: &str, key: &str, default: i64) -> Result<i64, String> {
    let Some(v) = config_value(config, key) else { return Ok(default) };
    let digits = v.strip_prefix(['+', '-']).unwrap_or(v);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("{key} = {v}: not an integer"));
    }
    v.parse().map_err(|_| format!("{key} = {v}: integer out of range"))
}

/// The value of `key` as a float, or `default` when the configuration has
/// no such key. The value is a decimal number with an optional sign,
/// fraction and exponent (`1.5`, `-0.25`, `.5`, `3`, `2e-3`); `inf`, `nan`,
/// hexadecimal and values too large for an `f64` are refused.
///
/// Errors: a message naming the key and its value (`"rate = fast: not a
/// number"`).
pub fn config_float(config: &str, key: &str, default: f64) -> Result<f64, String> {
    let Some(v) = config_value(config, key) else { return Ok(default) };
    let bad = || format!("{key} = {v}: not a number");
    if !is_decimal_float(v) {
        return Err(bad());
    }
    v.parse::<f64>().ok().filter(|f| f.is_finite()).ok_or_else(bad)
}

/// `[+-]?(digits[.digits?]|.digits)([eE][+-]?digits)?`: the float syntax
/// every SDK accepts.
fn is_decimal_float(v: &str) -> bool {
    let v = v.strip_prefix(['+', '-']).unwrap_or(v);
    let (mantissa, exponent) = match v.split_once(['e', 'E']) {
        Some((m, e)) => (m, Some(e)),
        None => (v, None),
    };
    let digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let mantissa_ok = digits(int) && digits(frac) && !(int.is_empty() && frac.is_empty());
    let exponent_ok = exponent.is_none_or(|e| {
        let e = e.strip_prefix(['+', '-']).unwrap_or(e);
        !e.is_empty() && digits(e)
    });
    mantissa_ok && exponent_ok
}

/// The value of `key` as a boolean, or `default` when the configuration
/// has no such key: `true`, `yes`, `on`, `1` are true and `false`, `no`,
/// `off`, `0` false, in any case.
///
/// Errors: a message naming the key and its value (`"log = maybe: not a
/// boolean (true/false, yes/no, on/off, 1/0)"`).
pub fn config_bool(config: &str, key: &str, default: bool) -> Result<bool, String> {
    let Some(v) = config_value(config, key) else { return Ok(default) };
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(format!("{key} = {v}: not a boolean (true/false, yes/no, on/off, 1/0)")),
    }
}

/// Writes a line to the host log (rate-limited by the host).
pub fn log(level: Level, message: &str) {
    #[cfg(target_arch = "wasm32")]
    wit::sluice::nf::host_log::log(level, message);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = (level, message);
}

/// Emits structured events, e.g. IDS alerts. Send a batch's events in one
/// call: each call crosses into the host.
pub fn emit(events: &[Event]) {
    #[cfg(target_arch = "wasm32")]
    wit::sluice::nf::host_log::emit(events);
    #[cfg(not(target_arch = "wasm32"))]
    let _ = events;
}

#[doc(hidden)]
pub mod __private {
    //! Glue used by [`export_nf!`](crate::export_nf); not public API.
    use crate::{Batch, BatchResult, NetworkFunction, NfInfo};
    use std::cell::RefCell;

    /// Holds the one NF value of this instance (in a `thread_local!`:
    /// components are single-threaded, so this is just a global).
    pub struct Slot<T>(RefCell<Option<T>>);

    impl<T: NetworkFunction> Default for Slot<T> {
        fn default() -> Self {
            Self::new()
        }
    }

    impl<T: NetworkFunction> Slot<T> {
        /// An empty slot.
        pub const fn new() -> Self {
            Slot(RefCell::new(None))
        }

        /// `init` export.
        pub fn init(&self, config: Vec<u8>) -> Result<NfInfo, String> {
            let (nf, info) = T::init(&config)?;
            *self.0.borrow_mut() = Some(nf);
            Ok(info)
        }

        /// `expired` export.
        pub fn expired(&self, table: u32, entries: Vec<u8>) -> Result<(), String> {
            let mut guard = self.0.borrow_mut();
            let nf = guard.as_mut().ok_or_else(|| "expired called before a successful init".to_string())?;
            nf.expired(table, &entries)
        }

        /// `process` export.
        pub fn process(&self, frame: Vec<u8>) -> Result<BatchResult, String> {
            let mut guard = self.0.borrow_mut();
            let nf = guard.as_mut().ok_or_else(|| "process called before a successful init".to_string())?;
            let mut b = Batch::from_frame(frame)?;
            nf.process(&mut b)?;
            Ok(b.finish())
        }
    }
}

/// Exports a [`NetworkFunction`] implementation as the component's `nf`
/// interface. Use once per NF crate, at the crate root.
#[macro_export]
macro_rules! export_nf {
    ($ty:ty) => {
        #[cfg(target_arch = "wasm32")]
        const _: () = {
            ::std::thread_local! {
                static __SLUICE_NF: $crate::__private::Slot<$ty> = const { $crate::__private::Slot::new() };
            }
            struct __SluiceExport;
            impl $crate::wit::exports::sluice::nf::nf::Guest for __SluiceExport {
                fn init(config: ::std::vec::Vec<u8>) -> ::std::result::Result<$crate::NfInfo, ::std::string::String> {
                    __SLUICE_NF.with(|s| s.init(config))
                }
                fn process(
                    batch: ::std::vec::Vec<u8>,
                ) -> ::std::result::Result<$crate::BatchResult, ::std::string::String> {
                    __SLUICE_NF.with(|s| s.process(batch))
                }
                fn expired(
                    table: u32,
                    entries: ::std::vec::Vec<u8>,
                ) -> ::std::result::Result<(), ::std::string::String> {
                    __SLUICE_NF.with(|s| s.expired(table, entries))
                }
            }
    $crate::wit::__export_network_function!(__SluiceExport with_types_in $crate::wit);
        };
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    const CONFIG: &str = "# limits\ncapacity = 40\nneg=-7\nplus = +3\nbig = 9223372036854775808\nbad = 12k\n\
                          ratio = 1.5\nhalf = .5\nexp = 2e-3\nhuge = 1e400\nword = fast\n\
                          on = Yes\noff = 0\nmaybe = maybe\nname = edge-1\nempty =\n";

    #[test]
    fn config_int_reads_decimal_integers_and_refuses_the_rest() {
        assert_eq!(config_int(CONFIG, "capacity", 0), Ok(40));
        assert_eq!(config_int(CONFIG, "neg", 0), Ok(-7));
        assert_eq!(config_int(CONFIG, "plus", 0), Ok(3));
        assert_eq!(config_int(CONFIG, "absent", 9), Ok(9));
        assert_eq!(config_int(CONFIG, "bad", 0), Err("bad = 12k: not an integer".into()));
        assert_eq!(config_int(CONFIG, "empty", 0), Err("empty = : not an integer".into()));
        assert_eq!(config_int(CONFIG, "ratio", 0), Err("ratio = 1.5: not an integer".into()));
        assert_eq!(config_int(CONFIG, "big", 0), Err("big = 9223372036854775808: integer out of range".into()));
    }

    #[test]
    fn config_float_reads_decimal_numbers_only() {
        assert_eq!(config_float(CONFIG, "ratio", 0.0), Ok(1.5));
        assert_eq!(config_float(CONFIG, "half", 0.0), Ok(0.5));
        assert_eq!(config_float(CONFIG, "exp", 0.0), Ok(0.002));
        assert_eq!(config_float(CONFIG, "capacity", 0.0), Ok(40.0));
        assert_eq!(config_float(CONFIG, "absent", 2.5), Ok(2.5));
        assert_eq!(config_float(CONFIG, "word", 0.0), Err("word = fast: not a number".into()));
        assert_eq!(config_float(CONFIG, "huge", 0.0), Err("huge = 1e400: not a number".into()));
        for v in ["inf", "nan", "0x10", "1.", "1e", ".", "+", "1_0", "- 1"] {
            let c = format!("v = {v}");
            let ok = v == "1.";
            assert_eq!(config_float(&c, "v", 0.0).is_ok(), ok, "{v}");
        }
    }

    #[test]
    fn config_bool_and_str() {
        assert_eq!(config_bool(CONFIG, "on", false), Ok(true));
        assert_eq!(config_bool(CONFIG, "off", true), Ok(false));
        assert_eq!(config_bool(CONFIG, "absent", true), Ok(true));
        assert!(config_bool(CONFIG, "maybe", false).unwrap_err().starts_with("maybe = maybe: not a boolean"));
        assert_eq!(config_str(CONFIG, "name", "x"), "edge-1");
        assert_eq!(config_str(CONFIG, "empty", "x"), "");
        assert_eq!(config_str(CONFIG, "absent", "x"), "x");
    }
}
