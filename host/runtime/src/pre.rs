//! A loaded component, pre-instantiated against the host's linker: what
//! every instance of an NF module is made from, shared by all modules of
//! the same bytes (see [`crate::module`]).

use crate::bindings::{v0_1, v0_2, v0_3, v0_4, v0_5, v0_6, v0_7};
use crate::host::HostState;

/// A pre-instantiated component of one of the released contract versions.
#[derive(Clone)]
pub(crate) enum Pre {
    V1(v0_1::NetworkFunctionPre<HostState>),
    V2(v0_2::NetworkFunctionPre<HostState>),
    V3(v0_3::NetworkFunctionPre<HostState>),
    V4(v0_4::NetworkFunctionPre<HostState>),
    V5(v0_5::NetworkFunctionPre<HostState>),
    V6(v0_6::NetworkFunctionPre<HostState>),
    V7(v0_7::NetworkFunctionPre<HostState>),
}
