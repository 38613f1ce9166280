/*
 * The narrow C interface between Sluice and DPDK.
 *
 * DPDK's fast-path functions (rte_eth_rx_burst, rte_pktmbuf_mtod, ...) are
 * `static inline` and its structs change layout between releases, so Rust
 * never touches them directly: it calls these functions, which take and
 * return only plain integers, pointers and the small structs defined here.
 */
/* The interrupt-thread gate below registers its own interrupt handle,
 * which DPDK 22.11 still marks experimental. */
#define ALLOW_EXPERIMENTAL_API

#include <dirent.h>
#include <errno.h>
#include <sched.h>
#include <time.h>
#include <unistd.h>
#include <sys/eventfd.h>
#include <linux/if_packet.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>

#include <rte_dev.h>
#include <rte_devargs.h>
#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_interrupts.h>
#include <rte_ether.h>
#include <rte_kvargs.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mbuf_pool_ops.h>
#include <rte_mempool.h>
#include <rte_pause.h>

/* A symmetric Toeplitz key (0x6d5a repeated): both directions of a flow
 * hash to the same RSS queue, so a connection meets one worker. */
static uint8_t sl_symmetric_rss_key[40] = {
    0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a,
    0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a,
    0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a,
    0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a, 0x6d, 0x5a,
};

int sl_eal_init(int argc, char **argv) {
    int r = rte_eal_init(argc, argv);
    return r < 0 ? -rte_errno : r;
}

const char *sl_strerror(int err) { return rte_strerror(err); }

int sl_thread_register(void) {
    int r = rte_thread_register();
    return r < 0 ? -rte_errno : 0;
}

void sl_thread_unregister(void) { rte_thread_unregister(); }

/* The CPUs of the EAL's lcores (-l / --lcores): worker lcores first, then
 * the main lcore. Writes at most `cap`; returns how many there are. */
int sl_lcore_cpus(int *out, int cap) {
    int n = 0;
    unsigned lcore;
    RTE_LCORE_FOREACH_WORKER(lcore) {
        if (n < cap) out[n] = rte_lcore_to_cpu_id((int)lcore);
        n++;
    }
    if (n < cap) out[n] = rte_lcore_to_cpu_id((int)rte_get_main_lcore());
    return n + 1;
}

uint16_t sl_eth_dev_count_avail(void) { return rte_eth_dev_count_avail(); }

int sl_eth_dev_is_valid_port(uint16_t port) { return rte_eth_dev_is_valid_port(port); }

int sl_eth_dev_name(uint16_t port, char *buf, size_t cap) {
    char name[RTE_ETH_NAME_MAX_LEN];
    int r = rte_eth_dev_get_name_by_port(port, name);
    if (r != 0) return r;
    strncpy(buf, name, cap - 1);
    buf[cap - 1] = 0;
    return 0;
}

/*
 * A pool of `n` mbufs holding `data_room` bytes each after the headroom.
 *
 * With `want_lifo`, unless the EAL was told which mempool driver to use
 * (--mbuf-pool-ops-name), the pool is a LIFO stack ("stack" driver) where
 * that driver is loaded: the mbufs freed last are handed out first, still
 * in the CPU's caches. DPDK's default, a FIFO ring, hands out the mbufs
 * freed longest ago, so whenever a worker holds more mbufs at once than
 * its lcore's cache (a burst for each of 16 lanes: 512 packets) they come
 * cold from the whole pool; for bursts the cache holds, the ring is as
 * fast or faster. Without the driver the default is used. `*lifo` says
 * which.
 */
struct rte_mempool *sl_pktmbuf_pool_create(const char *name, unsigned n, unsigned cache, uint16_t data_room,
                                           int socket, int want_lifo, int *lifo) {
    uint16_t room = (uint16_t)(data_room + RTE_PKTMBUF_HEADROOM);
    *lifo = 0;
    if (want_lifo && rte_mbuf_user_mempool_ops() == NULL) {
        struct rte_mempool *mp = rte_pktmbuf_pool_create_by_ops(name, n, cache, 0, room, socket, "stack");
        if (mp != NULL) {
            *lifo = 1;
            return mp;
        }
    }
    return rte_pktmbuf_pool_create(name, n, cache, 0, room, socket);
}

void sl_mempool_free(struct rte_mempool *mp) { rte_mempool_free(mp); }

int sl_socket_id(uint16_t port) { return rte_eth_dev_socket_id(port); }

/*
 * The interrupt-thread gate: a memif peer that dies cannot take the
 * process with it.
 *
 * DPDK's memif PMD tears a link down on the EAL interrupt thread when the
 * peer's control socket closes (memif_disconnect): it clears the link's
 * connected flag and then unmaps the rings and packet buffers the two
 * processes shared. Nothing keeps a thread that is inside a burst on that
 * port off them: one that checked the flag just before, and is preempted
 * in the middle of its copy (on a loaded machine, or on the core the
 * interrupt thread woke on), resumes on unmapped memory and the process
 * dies of SIGSEGV. A `kill -9` of one host would take the dispatcher, and
 * with it every host's traffic, down.
 *
 * So on a process with memif ports the interrupt thread runs DPDK's
 * callbacks only while no burst on such a port is in flight, as VPP stops
 * its workers at a barrier before it unmaps a memif region. The thread
 * spends its time parked in a callback of ours, with bursts allowed; every
 * SL_GATE_PERIOD_US it closes the gate to new bursts, waits for those in
 * flight, and returns to run whatever came meanwhile (a peer's disconnect
 * among them). The callback hangs on an eventfd it makes readable again
 * before it returns, so the thread comes back to it as soon as the other
 * events of that wakeup are handled, and reopens the gate. A burst on a
 * memif port that finds the gate closed waits for it (a few microseconds;
 * the events are short). Costs: two atomic operations on the thread's own
 * cache line per burst on a memif port (none on other ports), and up to
 * SL_GATE_PERIOD_US before DPDK acts on an interrupt (a memif link seen
 * down, a connect message, a NIC's link change).
 */

#define SL_GATE_PERIOD_US 1000
/* One slot per lcore, and one shared by threads without an lcore id. */
#define SL_GATE_SLOTS (RTE_MAX_LCORE + 1)

struct sl_gate_slot {
    uint32_t busy; /* bursts in flight on this slot's thread(s) */
} __rte_cache_aligned;

static struct sl_gate_slot sl_gate_slots[SL_GATE_SLOTS];
/* 1 while the interrupt thread may run DPDK's callbacks: no new burst on
 * a guarded port starts. */
static uint32_t sl_gate_closed = 1;
static uint32_t sl_gate_stopping;
static int sl_gate_fd = -1;
static struct rte_intr_handle *sl_gate_ih;
/* Ports whose bursts pass the gate (memif). */
static uint8_t sl_guarded[RTE_MAX_ETHPORTS];

static void sl_gate_cb(void *arg) {
    (void)arg;
    uint64_t v;
    if (read(sl_gate_fd, &v, sizeof(v)) < 0) { /* nothing to drain */ }
    if (__atomic_load_n(&sl_gate_stopping, __ATOMIC_ACQUIRE)) return;
    /* Parked: bursts may run. */
    __atomic_store_n(&sl_gate_closed, 0, __ATOMIC_RELEASE);
    struct timespec t = {0, SL_GATE_PERIOD_US * 1000L};
    while (nanosleep(&t, &t) != 0 && errno == EINTR) {
    }
    /* Leaving: no new burst starts (the store is ordered before the loads
     * of the slots, as a burst's increment is before its load of the
     * flag: one of the two sees the other). */
    __atomic_store_n(&sl_gate_closed, 1, __ATOMIC_SEQ_CST);
    for (unsigned i = 0; i < SL_GATE_SLOTS; i++) {
        for (unsigned spins = 0; __atomic_load_n(&sl_gate_slots[i].busy, __ATOMIC_SEQ_CST) != 0; spins++) {
            if (spins < 64)
                rte_pause();
            else
                sched_yield();
        }
    }
    /* Back here once the other events of this wakeup are handled. */
    uint64_t one = 1;
    if (write(sl_gate_fd, &one, sizeof(one)) < 0) {
        /* An eventfd write fails only at its counter's limit, when it is
         * readable anyway. */
    }
}

/* Puts port `port` behind the gate, starting the gate on first use.
 * Returns 0 or -errno; without the gate the port is not guarded. */
static int sl_gate_guard(uint16_t port) {
    if (sl_gate_ih == NULL) {
        int fd = eventfd(1, EFD_NONBLOCK | EFD_CLOEXEC);
        if (fd < 0) return -errno;
        struct rte_intr_handle *ih = rte_intr_instance_alloc(RTE_INTR_INSTANCE_F_PRIVATE);
        if (ih == NULL) {
            close(fd);
            return -ENOMEM;
        }
        int r = rte_intr_fd_set(ih, fd);
        if (r == 0) r = rte_intr_type_set(ih, RTE_INTR_HANDLE_EXT);
        sl_gate_fd = fd;
        if (r == 0) r = rte_intr_callback_register(ih, sl_gate_cb, NULL);
        if (r != 0) {
            rte_intr_instance_free(ih);
            close(fd);
            sl_gate_fd = -1;
            return r < 0 ? r : -r;
        }
        sl_gate_ih = ih;
    }
    __atomic_store_n(&sl_guarded[port], 1, __ATOMIC_RELEASE);
    return 0;
}

/* Stops the gate (before EAL cleanup, after the last burst). */
static void sl_gate_stop(void) {
    if (sl_gate_ih == NULL) return;
    __atomic_store_n(&sl_gate_stopping, 1, __ATOMIC_RELEASE);
    /* Waits for a parked callback to return (within SL_GATE_PERIOD_US). */
    (void)rte_intr_callback_unregister_sync(sl_gate_ih, sl_gate_cb, NULL);
    rte_intr_instance_free(sl_gate_ih);
    sl_gate_ih = NULL;
    close(sl_gate_fd);
    sl_gate_fd = -1;
    memset(sl_guarded, 0, sizeof(sl_guarded));
}

int sl_eal_cleanup(void) {
    sl_gate_stop();
    return rte_eal_cleanup();
}

static inline struct sl_gate_slot *sl_gate_enter(void) {
    unsigned id = rte_lcore_id();
    struct sl_gate_slot *s = &sl_gate_slots[id < RTE_MAX_LCORE ? id : RTE_MAX_LCORE];
    for (;;) {
        __atomic_fetch_add(&s->busy, 1, __ATOMIC_SEQ_CST);
        if (!__atomic_load_n(&sl_gate_closed, __ATOMIC_SEQ_CST)) return s;
        __atomic_fetch_sub(&s->busy, 1, __ATOMIC_RELEASE);
        for (unsigned spins = 0; __atomic_load_n(&sl_gate_closed, __ATOMIC_ACQUIRE); spins++) {
            if (spins < 256)
                rte_pause();
            else
                sched_yield();
        }
    }
}

static inline void sl_gate_leave(struct sl_gate_slot *s) { __atomic_fetch_sub(&s->busy, 1, __ATOMIC_RELEASE); }

/*
 * What net_af_packet leaves uncounted.
 *
 * DPDK 22.11's net_af_packet PMD receives from and sends into the mmap'd
 * rings of AF_PACKET sockets, one per queue pair, opened when EAL probes
 * the vdev and closed when the port closes. Two losses happen in the
 * kernel, where the PMD never sees them:
 *
 *  - Receive: a frame that finds the socket's RX ring full is dropped by
 *    the kernel and counted only in the socket's PACKET_STATISTICS
 *    (tp_drops); the PMD reports no imissed. Reading PACKET_STATISTICS
 *    returns the counts since the previous read and resets them, so the
 *    shim is their only reader and adds each read to `ring_dropped`.
 *  - Transmit: the PMD sets PACKET_LOSS, so the kernel skips a frame it
 *    refuses (longer than the interface's MTU plus the Ethernet header,
 *    plus 4 bytes if it carries an 802.1Q tag) without a trace, and the
 *    PMD counts it as sent. The shim counts such frames as the PMD takes
 *    them (`tx_refused`); it only counts: the PMD still gets them, so
 *    what is sent stays the kernel's decision. Frames too long for the
 *    ring's frames the PMD drops itself and counts in oerrors; they are
 *    not counted again.
 *
 * The sockets are found by address: of the process's open descriptors
 * (/proc/self/fd), the AF_PACKET sockets bound to the port's interface
 * (dev_info.if_index), lowest first, at most one per queue pair the device
 * has, none already another port's.
 */

/* Sockets one port may have (the PMD's qpairs). */
#define SL_KERNEL_SOCKETS 64

struct sl_kernel_port {
    int fds[SL_KERNEL_SOCKETS];
    int nfds;
    int ifindex;
    /* The longest frame the PMD puts in its TX ring. */
    uint32_t frame_data_size;
    /* Atomic: the longest untagged frame the kernel sends (MTU plus
     * Ethernet header); 0 when the port's frames are not checked. */
    uint32_t max_len;
    /* Atomic counters. */
    uint64_t ring_dropped;
    uint64_t tx_refused;
};

static struct sl_kernel_port sl_kports[RTE_MAX_ETHPORTS];

static int sl_fd_claimed(int fd) {
    for (unsigned p = 0; p < RTE_MAX_ETHPORTS; p++)
        for (int i = 0; i < sl_kports[p].nfds; i++)
            if (sl_kports[p].fds[i] == fd) return 1;
    return 0;
}

static int sl_int_cmp(const void *a, const void *b) {
    int x = *(const int *)a, y = *(const int *)b;
    return (x > y) - (x < y);
}

/* Reads the interface's MTU again (it may change while the port runs). */
static void sl_kernel_refresh(struct sl_kernel_port *k) {
    struct ifreq ifr;
    memset(&ifr, 0, sizeof(ifr));
    if (k->nfds == 0 || if_indextoname((unsigned)k->ifindex, ifr.ifr_name) == NULL) return;
    if (ioctl(k->fds[0], SIOCGIFHWADDR, &ifr) != 0 || ifr.ifr_hwaddr.sa_family != ARPHRD_ETHER) {
        /* Not Ethernet: the rule above does not apply; check nothing. */
        __atomic_store_n(&k->max_len, 0, __ATOMIC_RELAXED);
        return;
    }
    if (ioctl(k->fds[0], SIOCGIFMTU, &ifr) != 0 || ifr.ifr_mtu <= 0) return;
    __atomic_store_n(&k->max_len, (uint32_t)ifr.ifr_mtu + RTE_ETHER_HDR_LEN, __ATOMIC_RELAXED);
}

/* Finds a started net_af_packet port's sockets; other ports get none. */
static void sl_kernel_attach(uint16_t port) {
    if (port >= RTE_MAX_ETHPORTS) return;
    struct sl_kernel_port *k = &sl_kports[port];
    memset(k, 0, sizeof(*k));
    struct rte_eth_dev_info info;
    if (rte_eth_dev_info_get(port, &info) != 0 || info.driver_name == NULL ||
        strcmp(info.driver_name, "net_af_packet") != 0 || info.if_index == 0)
        return;
    /* The PMD's frame size: its `framesz` argument, 2048 by default. */
    unsigned framesz = 2048;
    const struct rte_devargs *da = info.device != NULL ? rte_dev_devargs(info.device) : NULL;
    if (da != NULL && da->args != NULL) {
        struct rte_kvargs *kv = rte_kvargs_parse(da->args, NULL);
        if (kv != NULL) {
            const char *v = rte_kvargs_get(kv, "framesz");
            if (v != NULL) framesz = (unsigned)strtoul(v, NULL, 10);
            rte_kvargs_free(kv);
        }
    }
    const unsigned hdr = TPACKET2_HDRLEN - sizeof(struct sockaddr_ll);
    if (framesz <= hdr) return;

    int found[SL_KERNEL_SOCKETS];
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (d == NULL) return;
    struct dirent *e;
    while ((e = readdir(d)) != NULL && n < SL_KERNEL_SOCKETS) {
        char *end = NULL;
        long fd = strtol(e->d_name, &end, 10);
        if (end == e->d_name || *end != '\0' || fd < 0 || fd > INT32_MAX || fd == dirfd(d)) continue;
        struct sockaddr_ll sll;
        socklen_t len = sizeof(sll);
        memset(&sll, 0, sizeof(sll));
        if (getsockname((int)fd, (struct sockaddr *)&sll, &len) != 0 || sll.sll_family != AF_PACKET ||
            sll.sll_ifindex != (int)info.if_index || sl_fd_claimed((int)fd))
            continue;
        found[n++] = (int)fd;
    }
    closedir(d);
    qsort(found, (size_t)n, sizeof(found[0]), sl_int_cmp);
    if (n > info.max_rx_queues) n = info.max_rx_queues;
    memcpy(k->fds, found, (size_t)n * sizeof(found[0]));
    k->ifindex = (int)info.if_index;
    k->frame_data_size = framesz - hdr;
    k->nfds = n;
    sl_kernel_refresh(k);
}

static void sl_kernel_detach(uint16_t port) {
    if (port >= RTE_MAX_ETHPORTS) return;
    __atomic_store_n(&sl_kports[port].max_len, 0, __ATOMIC_RELAXED);
    sl_kports[port].nfds = 0;
}

/* Adds the sockets' ring drops since the last read; returns the counters. */
static void sl_kernel_stats(uint16_t port, uint64_t *ring_dropped, uint64_t *tx_refused) {
    *ring_dropped = 0;
    *tx_refused = 0;
    if (port >= RTE_MAX_ETHPORTS) return;
    struct sl_kernel_port *k = &sl_kports[port];
    for (int i = 0; i < k->nfds; i++) {
        struct tpacket_stats st;
        socklen_t len = sizeof(st);
        memset(&st, 0, sizeof(st));
        if (getsockopt(k->fds[i], SOL_PACKET, PACKET_STATISTICS, &st, &len) == 0)
            __atomic_fetch_add(&k->ring_dropped, (uint64_t)st.tp_drops, __ATOMIC_RELAXED);
    }
    sl_kernel_refresh(k);
    *ring_dropped = __atomic_load_n(&k->ring_dropped, __ATOMIC_RELAXED);
    *tx_refused = __atomic_load_n(&k->tx_refused, __ATOMIC_RELAXED);
}

/* Of pkts[from, to), the frames the kernel will refuse (see above). */
static uint32_t sl_kernel_refusals(struct rte_mbuf **pkts, uint16_t from, uint16_t to, uint32_t max_len,
                                   uint32_t frame_data_size) {
    uint32_t n = 0;
    for (uint16_t i = from; i < to; i++) {
        const struct rte_mbuf *m = pkts[i];
        if (m->pkt_len <= max_len || m->pkt_len > frame_data_size) continue;
        if (m->pkt_len <= max_len + RTE_VLAN_HLEN && m->data_len >= RTE_ETHER_HDR_LEN &&
            rte_pktmbuf_mtod(m, const struct rte_ether_hdr *)->ether_type ==
                rte_cpu_to_be_16(RTE_ETHER_TYPE_VLAN))
            continue;
        n++;
    }
    return n;
}

/* Configures and starts a port with `queues` RX and TX queues. RSS is
 * asked for (IP/TCP/UDP, symmetric key) where the device offers it, or
 * on IP addresses only (RTE_ETH_RSS_IP, testpmd's --rss-ip) when
 * `ip_only` is set; `*rss_enabled` says whether it is on. Returns 0 or
 * -errno. */
int sl_port_start(uint16_t port, uint16_t queues, uint16_t nb_desc, struct rte_mempool *pool,
                  int ip_only, int *rss_enabled, uint16_t *max_queues) {
    struct rte_eth_dev_info info;
    int r = rte_eth_dev_info_get(port, &info);
    if (r != 0) return r;
    *max_queues = info.max_rx_queues < info.max_tx_queues ? info.max_rx_queues : info.max_tx_queues;
    if (queues > info.max_rx_queues || queues > info.max_tx_queues) return -EINVAL;

    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof(conf));
    uint64_t wanted = ip_only ? RTE_ETH_RSS_IP : (RTE_ETH_RSS_IP | RTE_ETH_RSS_TCP | RTE_ETH_RSS_UDP);
    uint64_t rss_hf = wanted & info.flow_type_rss_offloads;
    *rss_enabled = 0;
    if (queues > 1 && rss_hf != 0) {
        conf.rxmode.mq_mode = RTE_ETH_MQ_RX_RSS;
        conf.rx_adv_conf.rss_conf.rss_key = sl_symmetric_rss_key;
        conf.rx_adv_conf.rss_conf.rss_key_len = sizeof(sl_symmetric_rss_key);
        conf.rx_adv_conf.rss_conf.rss_hf = rss_hf;
        *rss_enabled = 1;
    }
    r = rte_eth_dev_configure(port, queues, queues, &conf);
    if (r != 0) return r;
    uint16_t rxd = nb_desc, txd = nb_desc;
    r = rte_eth_dev_adjust_nb_rx_tx_desc(port, &rxd, &txd);
    if (r != 0) return r;
    int socket = rte_eth_dev_socket_id(port);
    for (uint16_t q = 0; q < queues; q++) {
        r = rte_eth_rx_queue_setup(port, q, rxd, socket, NULL, pool);
        if (r != 0) return r;
        r = rte_eth_tx_queue_setup(port, q, txd, socket, NULL);
        if (r != 0) return r;
    }
    /* Before the link can come up: its bursts pass the gate from the first. */
    if (info.driver_name != NULL && strcmp(info.driver_name, "net_memif") == 0) {
        r = sl_gate_guard(port);
        if (r != 0) return r;
    }
    r = rte_eth_dev_start(port);
    if (r != 0) return r;
    /* Not every virtual device supports promiscuous mode; that is fine. */
    (void)rte_eth_promiscuous_enable(port);
    sl_kernel_attach(port);
    return 0;
}

/* The port's MTU: for net_af_packet its interface's (the kernel decides
 * what it sends), else the device's; 0 when unknown. */
int sl_port_mtu(uint16_t port) {
    if (port < RTE_MAX_ETHPORTS) {
        uint32_t max_len = __atomic_load_n(&sl_kports[port].max_len, __ATOMIC_RELAXED);
        if (max_len > RTE_ETHER_HDR_LEN) return (int)(max_len - RTE_ETHER_HDR_LEN);
    }
    uint16_t mtu = 0;
    if (rte_eth_dev_get_mtu(port, &mtu) != 0) return 0;
    return mtu;
}

int sl_port_stop(uint16_t port) {
    sl_kernel_detach(port);
    int r = rte_eth_dev_stop(port);
    if (r != 0) return r;
    return rte_eth_dev_close(port);
}

/* 1 when the port's link is up, 0 when down, negative on error. */
int sl_port_link_up(uint16_t port) {
    struct rte_eth_link link;
    memset(&link, 0, sizeof(link));
    int r = rte_eth_link_get_nowait(port, &link);
    if (r != 0) return r;
    return link.link_status == RTE_ETH_LINK_UP ? 1 : 0;
}

/* Port counters: the device's, and what the kernel dropped or refused
 * behind a net_af_packet port (see above; 0 for other devices). */
struct sl_port_stats {
    uint64_t ipackets, opackets, ibytes, obytes, imissed, ierrors, oerrors, rx_nombuf;
    uint64_t ring_dropped, tx_refused;
};

int sl_port_stats(uint16_t port, struct sl_port_stats *out) {
    struct rte_eth_stats s;
    int r = rte_eth_stats_get(port, &s);
    if (r != 0) return r;
    out->ipackets = s.ipackets;
    out->opackets = s.opackets;
    out->ibytes = s.ibytes;
    out->obytes = s.obytes;
    out->imissed = s.imissed;
    out->ierrors = s.ierrors;
    out->oerrors = s.oerrors;
    out->rx_nombuf = s.rx_nombuf;
    sl_kernel_stats(port, &out->ring_dropped, &out->tx_refused);
    return 0;
}

static inline int sl_is_guarded(uint16_t port) {
    return port < RTE_MAX_ETHPORTS && __atomic_load_n(&sl_guarded[port], __ATOMIC_RELAXED);
}

uint16_t sl_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    if (likely(!sl_is_guarded(port))) return rte_eth_rx_burst(port, queue, pkts, n);
    struct sl_gate_slot *s = sl_gate_enter();
    uint16_t got = rte_eth_rx_burst(port, queue, pkts, n);
    sl_gate_leave(s);
    return got;
}

static uint16_t sl_tx_burst_unguarded(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    struct sl_kernel_port *k = port < RTE_MAX_ETHPORTS ? &sl_kports[port] : NULL;
    uint32_t max_len = k != NULL ? __atomic_load_n(&k->max_len, __ATOMIC_RELAXED) : 0;
    if (max_len == 0) return rte_eth_tx_burst(port, queue, pkts, n);
    uint32_t refused = sl_kernel_refusals(pkts, 0, n, max_len, k->frame_data_size);
    uint16_t sent = rte_eth_tx_burst(port, queue, pkts, n);
    /* Only what the PMD took counts; the rest is still the caller's. */
    if (refused > 0) refused -= sl_kernel_refusals(pkts, sent, n, max_len, k->frame_data_size);
    if (refused > 0) __atomic_fetch_add(&k->tx_refused, (uint64_t)refused, __ATOMIC_RELAXED);
    return sent;
}

uint16_t sl_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    if (likely(!sl_is_guarded(port))) return sl_tx_burst_unguarded(port, queue, pkts, n);
    struct sl_gate_slot *s = sl_gate_enter();
    uint16_t sent = sl_tx_burst_unguarded(port, queue, pkts, n);
    sl_gate_leave(s);
    return sent;
}

/* What Rust needs to know about an mbuf. */
struct sl_mbuf_info {
    const uint8_t *data; /* first segment's data */
    uint32_t data_len;   /* bytes in the first segment */
    uint32_t pkt_len;    /* bytes in all segments */
    uint16_t nb_segs;
    uint16_t port;
    uint32_t rss_hash;
};

void sl_mbuf_info(const struct rte_mbuf *m, struct sl_mbuf_info *out) {
    out->data = rte_pktmbuf_mtod(m, const uint8_t *);
    out->data_len = m->data_len;
    out->pkt_len = m->pkt_len;
    out->nb_segs = m->nb_segs;
    out->port = m->port;
    out->rss_hash = (m->ol_flags & RTE_MBUF_F_RX_RSS_HASH) ? m->hash.rss : 0;
}

/* How many packets ahead sl_mbuf_infos prefetches: far enough that a
 * packet's first cache line is on its way while the ones before it are
 * read, near enough that it is still cached when its turn comes. */
#define SL_PREFETCH 4

/* sl_mbuf_info of n mbufs in one call, prefetching each packet's first
 * bytes (the headers the host parses next) SL_PREFETCH packets ahead. */
void sl_mbuf_infos(struct rte_mbuf *const *m, uint16_t n, struct sl_mbuf_info *out) {
    for (uint16_t i = 0; i < n && i < SL_PREFETCH; i++) rte_prefetch0(rte_pktmbuf_mtod(m[i], const void *));
    for (uint16_t i = 0; i < n; i++) {
        if (i + SL_PREFETCH < n) rte_prefetch0(rte_pktmbuf_mtod(m[i + SL_PREFETCH], const void *));
        sl_mbuf_info(m[i], &out[i]);
    }
}

/* Whether the mbuf's data may be written in place: held once, and its
 * own buffer (not attached to another mbuf's or an external one). */
int sl_mbuf_writable(const struct rte_mbuf *m) {
    return rte_mbuf_refcnt_read(m) == 1 && RTE_MBUF_DIRECT(m);
}

/* Copies a (possibly multi-segment) packet into `buf`; returns the bytes
 * copied (at most `cap`). */
uint32_t sl_mbuf_read(const struct rte_mbuf *m, uint8_t *buf, uint32_t cap) {
    uint32_t len = m->pkt_len < cap ? m->pkt_len : cap;
    const void *p = rte_pktmbuf_read(m, 0, len, buf);
    if (p == NULL) return 0;
    if (p != buf) memcpy(buf, p, len);
    return len;
}

/* Replaces a packet's bytes (the NF rewrote it). The mbuf becomes a
 * single segment; returns 0, or -ENOSPC if `len` does not fit one. */
int sl_mbuf_set(struct rte_mbuf *m, const uint8_t *data, uint32_t len) {
    if (m->nb_segs > 1) {
        rte_pktmbuf_free(m->next);
        m->next = NULL;
        m->nb_segs = 1;
    }
    rte_pktmbuf_reset_headroom(m);
    m->data_len = 0;
    m->pkt_len = 0;
    if (len > rte_pktmbuf_tailroom(m)) {
        /* Give up the headroom to fit a grown packet. */
        m->data_off = 0;
        if (len > rte_pktmbuf_tailroom(m)) return -ENOSPC;
    }
    char *dst = rte_pktmbuf_append(m, (uint16_t)len);
    if (dst == NULL) return -ENOSPC;
    memcpy(dst, data, len);
    return 0;
}

struct rte_mbuf *sl_mbuf_alloc(struct rte_mempool *mp) { return rte_pktmbuf_alloc(mp); }

void sl_mbuf_free(struct rte_mbuf *m) { rte_pktmbuf_free(m); }
