//! Declarations of the C shim (`csrc/shim.c`) — the only DPDK symbols Rust
//! calls. Everything DPDK-internal stays behind opaque pointers.

use std::ffi::{c_char, c_int, c_uint};

/// Opaque `struct rte_mbuf`.
#[repr(C)]
pub struct RteMbuf {
    _opaque: [u8; 0],
}

/// Opaque `struct rte_mempool`.
#[repr(C)]
pub struct RteMempool {
    _opaque: [u8; 0],
}

/// `struct sl_port_stats`.
#[repr(C)]
#[derive(Debug, Default, Clone, Copy)]
pub struct SlPortStats {
    pub ipackets: u64,
    pub opackets: u64,
    pub ibytes: u64,
    pub obytes: u64,
    pub imissed: u64,
    pub ierrors: u64,
    pub oerrors: u64,
    pub rx_nombuf: u64,
    pub ring_dropped: u64,
    pub tx_refused: u64,
}

/// `struct sl_mbuf_info`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct SlMbufInfo {
    pub data: *const u8,
    pub data_len: u32,
    pub pkt_len: u32,
    pub nb_segs: u16,
    pub port: u16,
    pub rss_hash: u32,
}

unsafe extern "C" {
    pub fn sl_eal_init(argc: c_int, argv: *mut *mut c_char) -> c_int;
    pub fn sl_eal_cleanup() -> c_int;
    pub fn sl_strerror(err: c_int) -> *const c_char;
    pub fn sl_thread_register() -> c_int;
    pub fn sl_thread_unregister();
    pub fn sl_lcore_cpus(out: *mut c_int, cap: c_int) -> c_int;
    pub fn sl_eth_dev_count_avail() -> u16;
    pub fn sl_eth_dev_is_valid_port(port: u16) -> c_int;
    pub fn sl_eth_dev_name(port: u16, buf: *mut c_char, cap: usize) -> c_int;
    pub fn sl_pktmbuf_pool_create(
        name: *const c_char,
        n: c_uint,
        cache: c_uint,
        data_room: u16,
        socket: c_int,
        want_lifo: c_int,
        lifo: *mut c_int,
    ) -> *mut RteMempool;
    pub fn sl_mbuf_alloc(mp: *mut RteMempool) -> *mut RteMbuf;
    pub fn sl_port_mtu(port: u16) -> c_int;
    pub fn sl_mempool_free(mp: *mut RteMempool);
    pub fn sl_socket_id(port: u16) -> c_int;
    pub fn sl_port_start(
        port: u16,
        queues: u16,
        nb_desc: u16,
        pool: *mut RteMempool,
        ip_only: c_int,
        rss_enabled: *mut c_int,
        max_queues: *mut u16,
    ) -> c_int;
    pub fn sl_port_stop(port: u16) -> c_int;
    pub fn sl_port_stats(port: u16, out: *mut SlPortStats) -> c_int;
    pub fn sl_rx_burst(port: u16, queue: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    pub fn sl_tx_burst(port: u16, queue: u16, pkts: *mut *mut RteMbuf, n: u16) -> u16;
    pub fn sl_mbuf_info(m: *const RteMbuf, out: *mut SlMbufInfo);
    pub fn sl_mbuf_infos(m: *const *mut RteMbuf, n: u16, out: *mut SlMbufInfo);
    pub fn sl_mbuf_writable(m: *const RteMbuf) -> c_int;
    pub fn sl_port_link_up(port: u16) -> c_int;
    pub fn sl_mbuf_read(m: *const RteMbuf, buf: *mut u8, cap: u32) -> u32;
    pub fn sl_mbuf_set(m: *mut RteMbuf, data: *const u8, len: u32) -> c_int;
    pub fn sl_mbuf_free(m: *mut RteMbuf);
}
