//! DPDK packet I/O for the Sluice host.
//!
//! This crate is the DPDK FFI boundary: the only place in Sluice with
//! `unsafe` code. DPDK's fast path is `static inline` C and its structs
//! change between releases, so Rust calls a short C shim (`csrc/shim.c`)
//! that exposes plain functions, and wraps them here in a safe API:
//! [`Eal`] (process-wide init), [`Mempool`], [`Port`] (configure, start,
//! stats), [`Queue`] (one RX/TX queue pair, owned by one worker thread) and
//! [`Mbuf`] (an owned packet buffer, freed on drop).
//!
//! Built only with the host's `dpdk` feature; needs `libdpdk-dev` 22.11.

#![allow(unsafe_code)] // The FFI boundary; every block says why it is sound.

mod sys;

use std::ffi::{CStr, CString, c_char, c_int};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};

/// What went wrong in DPDK.
#[derive(Debug, thiserror::Error)]
pub enum DpdkError {
    /// EAL initialization failed.
    #[error(
        "DPDK EAL initialization failed ({reason}); check the EAL arguments after `--` (for testing without hugepages or NICs use `--no-huge --no-pci -m 512 --vdev=net_pcap0,rx_pcap=in.pcap,tx_pcap=out.pcap`)"
    )]
    EalInit {
        /// DPDK's reason.
        reason: String,
    },
    /// EAL was already initialized in this process.
    #[error("DPDK EAL is already initialized in this process")]
    AlreadyInitialized,
    /// An argument contains a NUL byte.
    #[error("EAL argument {0:?} contains a NUL byte")]
    BadArgument(String),
    /// No port with this id.
    #[error(
        "no DPDK port {port}: {available} port(s) available; add one with --vdev or bind a NIC with dpdk-devbind.py"
    )]
    NoSuchPort {
        /// Requested port.
        port: u16,
        /// Ports DPDK knows.
        available: u16,
    },
    /// Creating the mbuf pool failed.
    #[error(
        "cannot create the mbuf pool of {mbufs} mbufs ({reason}); give EAL more memory (-m <MiB>) or use fewer mbufs"
    )]
    Mempool {
        /// Pool size.
        mbufs: u32,
        /// DPDK's reason.
        reason: String,
    },
    /// Configuring or starting a port failed.
    #[error("cannot start DPDK port {port} ({name}) with {queues} queue(s): {reason}")]
    PortStart {
        /// Port.
        port: u16,
        /// Device name.
        name: String,
        /// Queues asked for.
        queues: u16,
        /// DPDK's reason.
        reason: String,
    },
    /// A rewritten packet does not fit one mbuf.
    #[error("a rewritten packet of {len} bytes does not fit one mbuf")]
    TooLong {
        /// Its length.
        len: usize,
    },
    /// A per-thread registration failed.
    #[error("cannot register the worker thread with DPDK: {0}")]
    Thread(String),
}

fn strerror(err: c_int) -> String {
    // SAFETY: rte_strerror returns a pointer to a static or thread-local
    // NUL-terminated string for any error number.
    unsafe { CStr::from_ptr(sys::sl_strerror(err.abs())) }.to_string_lossy().into_owned()
}

static EAL_UP: AtomicBool = AtomicBool::new(false);

/// The initialized DPDK environment. One per process; cleaned up on drop
/// (after every port, queue, pool and mbuf is gone: they borrow it).
#[derive(Debug)]
pub struct Eal {
    _private: (),
}

impl Eal {
    /// Initializes EAL with `args` (without a program name; one is added).
    pub fn init(args: &[String]) -> Result<Eal, DpdkError> {
        if EAL_UP.swap(true, Ordering::SeqCst) {
            return Err(DpdkError::AlreadyInitialized);
        }
        let mut owned = Vec::with_capacity(args.len() + 1);
        owned.push(CString::new("sluice-host").map_err(|_| DpdkError::BadArgument("sluice-host".into()))?);
        for a in args {
            owned.push(CString::new(a.as_str()).map_err(|_| DpdkError::BadArgument(a.clone()))?);
        }
        let mut argv: Vec<*mut c_char> = owned.iter().map(|s| s.as_ptr().cast_mut()).collect();
        argv.push(std::ptr::null_mut());
        let argc = c_int::try_from(owned.len()).unwrap_or(c_int::MAX);
        // SAFETY: argv holds argc valid NUL-terminated strings (kept alive by
        // `owned` for the call) and a terminating null; EAL may permute the
        // pointer array, which we own, but does not write through them.
        let r = unsafe { sys::sl_eal_init(argc, argv.as_mut_ptr()) };
        if r < 0 {
            EAL_UP.store(false, Ordering::SeqCst);
            return Err(DpdkError::EalInit { reason: strerror(r) });
        }
        Ok(Eal { _private: () })
    }

    /// Ports DPDK found (NICs bound to DPDK plus `--vdev` devices).
    pub fn port_count(&self) -> u16 {
        // SAFETY: EAL is initialized (self exists).
        unsafe { sys::sl_eth_dev_count_avail() }
    }

    /// The device name of a port.
    pub fn port_name(&self, port: u16) -> Option<String> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: buf is writable for its length; the shim NUL-terminates.
        let r = unsafe { sys::sl_eth_dev_name(port, buf.as_mut_ptr(), buf.len()) };
        if r != 0 {
            return None;
        }
        // SAFETY: the shim wrote a NUL-terminated string into buf.
        Some(unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned())
    }

    /// Registers the calling (non-EAL) thread so that it gets an lcore id
    /// and per-lcore mempool caches. Unregistered when the guard drops.
    pub fn register_thread(&self) -> Result<ThreadGuard, DpdkError> {
        // SAFETY: EAL is initialized; registration is per calling thread.
        let r = unsafe { sys::sl_thread_register() };
        if r < 0 {
            return Err(DpdkError::Thread(strerror(r)));
        }
        Ok(ThreadGuard { _not_send: std::marker::PhantomData })
    }

    /// The CPUs of the EAL's lcores (`-l`/`--lcores`): those of the worker
    /// lcores first, then the main lcore's. Worker threads take them in
    /// this order.
    pub fn lcore_cpus(&self) -> Vec<usize> {
        let mut buf = [0 as c_int; 1024];
        let cap = c_int::try_from(buf.len()).unwrap_or(c_int::MAX);
        // SAFETY: EAL is initialized; buf is writable for `cap` ints and the
        // shim writes at most that many.
        let n = unsafe { sys::sl_lcore_cpus(buf.as_mut_ptr(), cap) };
        let n = usize::try_from(n).unwrap_or(0).min(buf.len());
        buf.iter().take(n).filter_map(|&c| usize::try_from(c).ok()).collect()
    }

    /// Whether DPDK has a port with this id.
    pub fn has_port(&self, port: u16) -> bool {
        // SAFETY: EAL is initialized; any port id may be asked about.
        unsafe { sys::sl_eth_dev_is_valid_port(port) != 0 }
    }

    /// Fails with [`DpdkError::NoSuchPort`] unless the port exists.
    pub fn check_port(&self, port: u16) -> Result<(), DpdkError> {
        if self.has_port(port) { Ok(()) } else { Err(DpdkError::NoSuchPort { port, available: self.port_count() }) }
    }

    /// The NUMA socket of a port (for its mempool); -1 (any) if unknown.
    pub fn socket_of(&self, port: u16) -> i32 {
        if !self.has_port(port) {
            return -1;
        }
        // SAFETY: EAL is initialized and the port exists.
        let s = unsafe { sys::sl_socket_id(port) };
        if s < 0 { -1 } else { s }
    }

    /// Creates a packet-mbuf pool of `mbufs` buffers of `data_room` bytes
    /// each (after the headroom; [`DEFAULT_DATA_ROOM`] holds a standard
    /// Ethernet frame, a port with larger frames needs more). With `lifo`
    /// the pool is a LIFO stack where DPDK's `stack` driver is loaded and
    /// the EAL names no other ([`Mempool::is_lifo`]): for workers that hold
    /// more mbufs at once than an lcore's cache of [`POOL_CACHE`].
    pub fn mempool(
        &self,
        name: &str,
        mbufs: u32,
        data_room: u16,
        socket: i32,
        lifo: bool,
    ) -> Result<Mempool, DpdkError> {
        let cname = CString::new(name).map_err(|_| DpdkError::BadArgument(name.into()))?;
        if data_room > MAX_DATA_ROOM {
            return Err(DpdkError::BadArgument(format!(
                "mbuf data room of {data_room} bytes: at most {MAX_DATA_ROOM}"
            )));
        }
        let mut used_lifo: c_int = 0;
        // SAFETY: EAL is initialized; the name is a valid C string; a
        // cache of POOL_CACHE is within RTE_MEMPOOL_CACHE_MAX_SIZE; the data room
        // plus the headroom fits the u16 the pool takes (checked above);
        // `used_lifo` is a valid place for the shim to say which driver it
        // used.
        let p = unsafe {
            sys::sl_pktmbuf_pool_create(
                cname.as_ptr(),
                mbufs,
                POOL_CACHE.min(mbufs / 4),
                data_room,
                socket,
                c_int::from(lifo),
                &mut used_lifo,
            )
        };
        NonNull::new(p).map(|ptr| Mempool { ptr, lifo: used_lifo != 0 }).ok_or_else(|| DpdkError::Mempool {
            mbufs,
            reason: "rte_pktmbuf_pool_create failed (not enough EAL memory?)".into(),
        })
    }

    /// Configures and starts port `port` with `queues` RX/TX queue pairs,
    /// spreading packets over them by the NIC's RSS where it has it: by
    /// IP addresses and ports, or by IP addresses alone when `ip_only`.
    pub fn start_port(
        &self,
        port: u16,
        queues: u16,
        descriptors: u16,
        pool: &Mempool,
        ip_only: bool,
    ) -> Result<Port, DpdkError> {
        self.check_port(port)?;
        let name = self.port_name(port).unwrap_or_else(|| format!("port {port}"));
        let mut rss: c_int = 0;
        let mut max_queues: u16 = 0;
        // SAFETY: the port is valid, the pool outlives the port (both are
        // dropped before Eal), and the out-pointers are valid locals.
        let r = unsafe {
            sys::sl_port_start(
                port,
                queues,
                descriptors,
                pool.ptr.as_ptr(),
                c_int::from(ip_only),
                &mut rss,
                &mut max_queues,
            )
        };
        if r != 0 {
            let reason = if r == -EINVAL && queues > max_queues {
                format!("the device supports at most {max_queues} queue(s); use fewer workers")
            } else {
                strerror(r)
            };
            return Err(DpdkError::PortStart { port, name, queues, reason });
        }
        Ok(Port { id: port, name, queues, rss: rss != 0 })
    }
}

/// `EINVAL` on Linux, the only platform DPDK's Linux EAL runs on.
const EINVAL: c_int = 22;

impl Drop for Eal {
    fn drop(&mut self) {
        // SAFETY: no DPDK object outlives the Eal (they borrow it or are
        // dropped first by their owners); cleanup releases EAL resources.
        unsafe { sys::sl_eal_cleanup() };
        EAL_UP.store(false, Ordering::SeqCst);
    }
}

/// Keeps a worker thread registered with EAL.
#[derive(Debug)]
pub struct ThreadGuard {
    _not_send: std::marker::PhantomData<*const ()>,
}

impl Drop for ThreadGuard {
    fn drop(&mut self) {
        // SAFETY: created by a successful sl_thread_register on this thread
        // (the guard is !Send, so it drops on the same thread).
        unsafe { sys::sl_thread_unregister() };
    }
}

/// Bytes an mbuf holds by default (after its headroom): DPDK's default,
/// a 1,518-byte Ethernet frame and then some.
pub const DEFAULT_DATA_ROOM: u16 = 2048;

/// Mbufs each lcore keeps in its own cache of a pool.
pub const POOL_CACHE: u32 = 256;
/// The largest data room: with DPDK's 128-byte headroom, what a 16-bit
/// buffer length holds.
pub const MAX_DATA_ROOM: u16 = u16::MAX - 128;

/// A pool of packet buffers.
#[derive(Debug)]
pub struct Mempool {
    ptr: NonNull<sys::RteMempool>,
    lifo: bool,
}

impl Mempool {
    /// Whether the pool is a LIFO stack (DPDK's `stack` driver), which
    /// hands out the mbufs freed last first; else the EAL's default driver
    /// (a FIFO ring unless `--mbuf-pool-ops-name` says otherwise).
    pub fn is_lifo(&self) -> bool {
        self.lifo
    }

    /// A new, empty mbuf from the pool; `None` when the pool is empty.
    /// Call only on a thread registered with EAL (a worker).
    pub fn alloc(&self) -> Option<Mbuf> {
        // SAFETY: the pool is valid while `self` lives; an mbuf allocated
        // from it is owned by the returned Mbuf, which frees it once.
        let m = unsafe { sys::sl_mbuf_alloc(self.ptr.as_ptr()) };
        NonNull::new(m).map(|ptr| Mbuf { ptr })
    }
}

// SAFETY: DPDK mempools are thread-safe (multi-producer/multi-consumer
// rings with per-lcore caches).
unsafe impl Send for Mempool {}
// SAFETY: as above; shared use from several threads is the design.
unsafe impl Sync for Mempool {}

impl Drop for Mempool {
    fn drop(&mut self) {
        // SAFETY: the pool was created by sl_pktmbuf_pool_create and its
        // ports are stopped before it is dropped (Port is dropped first).
        unsafe { sys::sl_mempool_free(self.ptr.as_ptr()) };
    }
}

/// Counters of a port: the device's, with what the kernel dropped or
/// refused behind a `net_af_packet` port folded in, so that every frame
/// the port lost is in `imissed` or `oerrors`.
///
/// DPDK 22.11's `net_af_packet` reports neither: a frame that finds its
/// socket's receive ring full is dropped by the kernel and counted only in
/// the socket's `PACKET_STATISTICS`, which the shim reads (and, as reading
/// resets them, accumulates); a frame the kernel refuses to send (longer
/// than the interface's MTU plus its Ethernet header, 4 more with an
/// 802.1Q tag) is skipped silently and counted by the PMD as sent, so the
/// shim counts such frames as the PMD takes them. On other devices
/// `ring_dropped` and `tx_refused` stay 0.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PortStats {
    /// Packets received.
    pub ipackets: u64,
    /// Packets sent (`net_af_packet`: less those the kernel refused).
    pub opackets: u64,
    /// Bytes received.
    pub ibytes: u64,
    /// Bytes sent (as the device counts them).
    pub obytes: u64,
    /// Packets dropped because the receive ring was full: the device's
    /// `imissed` plus `ring_dropped`.
    pub imissed: u64,
    /// Receive errors.
    pub ierrors: u64,
    /// Packets the port took to send but did not: the device's `oerrors`
    /// plus `tx_refused`.
    pub oerrors: u64,
    /// RX mbuf allocation failures.
    pub rx_nombuf: u64,
    /// Of `imissed`: frames the kernel dropped with a `net_af_packet`
    /// socket's receive ring full (its `tp_drops`).
    pub ring_dropped: u64,
    /// Of `oerrors`: frames a `net_af_packet` port took that the kernel
    /// refused to send (too long for the interface's MTU).
    pub tx_refused: u64,
}

/// A started port.
#[derive(Debug)]
pub struct Port {
    id: u16,
    name: String,
    queues: u16,
    rss: bool,
}

impl Port {
    /// Port id.
    pub fn id(&self) -> u16 {
        self.id
    }

    /// Device name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether RSS spreads flows over the queues (symmetric key).
    pub fn rss(&self) -> bool {
        self.rss
    }

    /// Number of queue pairs.
    pub fn queues(&self) -> u16 {
        self.queues
    }

    /// Queue pair `q` of this port, for one worker thread.
    pub fn queue(&self, q: u16) -> Option<Queue> {
        (q < self.queues).then_some(Queue { port: self.id, queue: q })
    }

    /// The port's MTU (the largest IP datagram it sends in one frame): a
    /// `net_af_packet` port's interface's, else the device's; `None` when
    /// the device does not say.
    pub fn mtu(&self) -> Option<u16> {
        // SAFETY: the port is started; the call only reads its MTU.
        let m = unsafe { sys::sl_port_mtu(self.id) };
        u16::try_from(m).ok().filter(|&m| m > 0)
    }

    /// Whether the port's link is up (a virtual device's peer connected).
    pub fn link_up(&self) -> bool {
        // SAFETY: the port is started; the call only reads its link state.
        unsafe { sys::sl_port_link_up(self.id) == 1 }
    }

    /// The port's counters (see [`PortStats`]). Each call also reads the
    /// kernel's counters of a `net_af_packet` port, and its interface's
    /// MTU again, so call it now and then on a long run (`serve` does,
    /// every second): the kernel's drop counters are 32-bit.
    pub fn stats(&self) -> PortStats {
        let mut s = sys::SlPortStats::default();
        // SAFETY: the port is started; `s` is a valid out-pointer.
        unsafe { sys::sl_port_stats(self.id, &mut s) };
        PortStats {
            ipackets: s.ipackets,
            opackets: s.opackets.saturating_sub(s.tx_refused),
            ibytes: s.ibytes,
            obytes: s.obytes,
            imissed: s.imissed + s.ring_dropped,
            ierrors: s.ierrors,
            oerrors: s.oerrors + s.tx_refused,
            rx_nombuf: s.rx_nombuf,
            ring_dropped: s.ring_dropped,
            tx_refused: s.tx_refused,
        }
    }
}

impl Drop for Port {
    fn drop(&mut self) {
        // SAFETY: the port was started by us; stopping and closing it once.
        unsafe { sys::sl_port_stop(self.id) };
    }
}

/// One RX/TX queue pair of a port. DPDK queues are not thread-safe: each
/// is used by exactly one worker, which `Queue` being `Send` but not `Clone`
/// and taking `&mut self` enforces. Bursts on a `net_memif` port pass the
/// shim's interrupt-thread gate, so that a peer's disconnect never unmaps
/// the link's memory under a burst (`csrc/shim.c`).
#[derive(Debug)]
pub struct Queue {
    port: u16,
    queue: u16,
}

impl Queue {
    /// Port id.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Queue index.
    pub fn index(&self) -> u16 {
        self.queue
    }

    /// Receives up to `max` packets, appending them to `out`.
    pub fn rx_burst(&mut self, out: &mut Vec<Mbuf>, max: u16) -> usize {
        out.reserve(usize::from(max));
        let len = out.len();
        let spare = out.spare_capacity_mut();
        let n = u16::try_from(spare.len()).unwrap_or(u16::MAX).min(max);
        // SAFETY: `spare` has room for `n` pointers (Mbuf is a transparent
        // non-null mbuf pointer); this queue is used by this thread only
        // (&mut self).
        let got = unsafe { sys::sl_rx_burst(self.port, self.queue, spare.as_mut_ptr().cast(), n) };
        let got = usize::from(got).min(usize::from(n));
        // SAFETY: DPDK wrote `got` valid, non-null mbuf pointers, which we
        // now own, right after the first `len` elements.
        unsafe { out.set_len(len + got) };
        got
    }

    /// Sends `pkts` out of `port`'s queue of the same index as this one;
    /// returns how many the device took. The rest stay in `pkts` (the
    /// caller decides to retry or drop them). Taken is not sent: what the
    /// device then drops or the kernel refuses is in the port's
    /// [`oerrors`](PortStats::oerrors).
    pub fn tx_burst(&mut self, port: u16, pkts: &mut Vec<Mbuf>) -> usize {
        let mut sent_total = 0;
        while !pkts.is_empty() {
            let n = u16::try_from(pkts.len()).unwrap_or(u16::MAX);
            // SAFETY: `pkts` holds at least `n` mbuf pointers we own (Mbuf
            // is a transparent mbuf pointer); the device takes ownership
            // of the first `sent`.
            let sent = unsafe { sys::sl_tx_burst(port, self.queue, pkts.as_mut_ptr().cast(), n) };
            let sent = usize::from(sent).min(usize::from(n));
            // The device owns the sent mbufs now: forget them without freeing.
            pkts.drain(..sent).for_each(std::mem::forget);
            sent_total += sent;
            if sent < usize::from(n) {
                break;
            }
        }
        sent_total
    }
}

/// The [`view`](Mbuf::view)s of `mbufs`, appended to `out`, read in one
/// call into DPDK per 64 packets, which also prefetches each packet's
/// first bytes a few packets ahead of the caller's parse.
pub fn views<'a>(mbufs: &'a [Mbuf], out: &mut Vec<MbufView<'a>>) {
    const CHUNK: usize = 64;
    let none = sys::SlMbufInfo { data: std::ptr::null(), data_len: 0, pkt_len: 0, nb_segs: 0, port: 0, rss_hash: 0 };
    let mut infos = [none; CHUNK];
    out.reserve(mbufs.len());
    for chunk in mbufs.chunks(CHUNK) {
        let n = chunk.len().min(CHUNK);
        // SAFETY: `chunk` holds `n` mbufs we own (Mbuf is a transparent
        // mbuf pointer), valid while `mbufs` is borrowed; `infos` has room
        // for `n` results.
        unsafe { sys::sl_mbuf_infos(chunk.as_ptr().cast(), n as u16, infos.as_mut_ptr()) };
        out.extend(infos.iter().take(n).map(|i| {
            // SAFETY: as in Mbuf::view: the first segment holds `data_len`
            // readable bytes at `data` while the mbuf is owned, here for
            // the borrow 'a of `mbufs`.
            let data = (i.nb_segs == 1 && !i.data.is_null())
                .then(|| unsafe { std::slice::from_raw_parts(i.data, i.data_len as usize) });
            MbufView { data, len: i.pkt_len as usize, port: i.port, rss_hash: i.rss_hash }
        }));
    }
}

/// What [`Mbuf::view`] returns.
#[derive(Debug, Clone, Copy)]
pub struct MbufView<'a> {
    /// The bytes, if the packet is one segment.
    pub data: Option<&'a [u8]>,
    /// Total length.
    pub len: usize,
    /// Ingress port.
    pub port: u16,
    /// The device's RSS hash of the packet, 0 when it gave none.
    pub rss_hash: u32,
}

/// An owned packet buffer; freed when dropped. A transparent non-null
/// mbuf pointer, so that bursts pass to DPDK as arrays of pointers.
#[derive(Debug)]
#[repr(transparent)]
pub struct Mbuf {
    ptr: NonNull<sys::RteMbuf>,
}

// SAFETY: an mbuf is owned by exactly one Mbuf value; moving it to another
// thread moves that ownership (DPDK frees to the pool from any thread).
unsafe impl Send for Mbuf {}

impl Mbuf {
    fn info(&self) -> sys::SlMbufInfo {
        let mut i =
            sys::SlMbufInfo { data: std::ptr::null(), data_len: 0, pkt_len: 0, nb_segs: 0, port: 0, rss_hash: 0 };
        // SAFETY: the mbuf is valid while we own it; `i` is a valid out-pointer.
        unsafe { sys::sl_mbuf_info(self.ptr.as_ptr(), &mut i) };
        i
    }

    /// The packet's bytes when it is one segment (the common case), without
    /// copying; `None` for a multi-segment packet (use [`read_into`]).
    ///
    /// [`read_into`]: Self::read_into
    pub fn data(&self) -> Option<&[u8]> {
        self.view().data
    }

    /// Bytes (if one segment), total length and ingress port, in one call
    /// into DPDK.
    pub fn view(&self) -> MbufView<'_> {
        let i = self.info();
        let data = (i.nb_segs == 1 && !i.data.is_null()).then(|| {
            // SAFETY: the first segment holds `data_len` readable bytes at
            // `data` for as long as we own the mbuf (the borrow of self).
            unsafe { std::slice::from_raw_parts(i.data, i.data_len as usize) }
        });
        MbufView { data, len: i.pkt_len as usize, port: i.port, rss_hash: i.rss_hash }
    }

    /// The first segment's bytes, writable in place (e.g. to rewrite an
    /// Ethernet address), when the mbuf is held once and owns its buffer;
    /// `None` otherwise.
    pub fn first_segment_mut(&mut self) -> Option<&mut [u8]> {
        // SAFETY: the mbuf is valid while we own it.
        if unsafe { sys::sl_mbuf_writable(self.ptr.as_ptr()) } == 0 {
            return None;
        }
        let i = self.info();
        (!i.data.is_null()).then(|| {
            // SAFETY: the first segment holds `data_len` bytes at `data`; the
            // mbuf is referenced once (by us, exclusively borrowed) and owns
            // its buffer, so no one else reads or writes them meanwhile.
            unsafe { std::slice::from_raw_parts_mut(i.data.cast_mut(), i.data_len as usize) }
        })
    }

    /// Total length of the packet (all segments).
    pub fn len(&self) -> usize {
        self.info().pkt_len as usize
    }

    /// Whether the packet is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The port it arrived on.
    pub fn port(&self) -> u16 {
        self.info().port
    }

    /// Copies the whole packet (any number of segments) into `buf`.
    pub fn read_into(&self, buf: &mut Vec<u8>) {
        let len = self.len();
        buf.resize(len, 0);
        // SAFETY: `buf` has `len` writable bytes; the shim copies at most that.
        let n = unsafe { sys::sl_mbuf_read(self.ptr.as_ptr(), buf.as_mut_ptr(), len as u32) } as usize;
        buf.truncate(n);
    }

    /// Replaces the packet's bytes (an NF rewrote it). Fails if they do not
    /// fit one mbuf.
    pub fn set_data(&mut self, data: &[u8]) -> Result<(), DpdkError> {
        // SAFETY: we own the mbuf; `data` is readable for its length.
        let r = unsafe { sys::sl_mbuf_set(self.ptr.as_ptr(), data.as_ptr(), data.len() as u32) };
        if r == 0 { Ok(()) } else { Err(DpdkError::TooLong { len: data.len() }) }
    }
}

impl Drop for Mbuf {
    fn drop(&mut self) {
        // SAFETY: we own the mbuf and drop it once.
        unsafe { sys::sl_mbuf_free(self.ptr.as_ptr()) };
    }
}
