/*
 * The narrow C interface between Sluice and DPDK.
 *
 * DPDK's fast-path functions (rte_eth_rx_burst, rte_pktmbuf_mtod, ...) are
 * `static inline` and its structs change layout between releases, so Rust
 * never touches them directly: it calls these functions, which take and
 * return only plain integers, pointers and the small structs defined here.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <rte_eal.h>
#include <rte_errno.h>
#include <rte_ethdev.h>
#include <rte_lcore.h>
#include <rte_mbuf.h>
#include <rte_mempool.h>

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

int sl_eal_cleanup(void) { return rte_eal_cleanup(); }

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

struct rte_mempool *sl_pktmbuf_pool_create(const char *name, unsigned n, unsigned cache, int socket) {
    return rte_pktmbuf_pool_create(name, n, cache, 0, RTE_MBUF_DEFAULT_BUF_SIZE, socket);
}

void sl_mempool_free(struct rte_mempool *mp) { rte_mempool_free(mp); }

int sl_socket_id(uint16_t port) { return rte_eth_dev_socket_id(port); }

/* Configures and starts a port with `queues` RX and TX queues. RSS is
 * asked for (IP/TCP/UDP, symmetric key) where the device offers it; 
 * `*rss_enabled` says whether it is on. Returns 0 or -errno. */
int sl_port_start(uint16_t port, uint16_t queues, uint16_t nb_desc, struct rte_mempool *pool,
                  int *rss_enabled, uint16_t *max_queues) {
    struct rte_eth_dev_info info;
    int r = rte_eth_dev_info_get(port, &info);
    if (r != 0) return r;
    *max_queues = info.max_rx_queues < info.max_tx_queues ? info.max_rx_queues : info.max_tx_queues;
    if (queues > info.max_rx_queues || queues > info.max_tx_queues) return -EINVAL;

    struct rte_eth_conf conf;
    memset(&conf, 0, sizeof(conf));
    uint64_t rss_hf = (RTE_ETH_RSS_IP | RTE_ETH_RSS_TCP | RTE_ETH_RSS_UDP) & info.flow_type_rss_offloads;
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
    r = rte_eth_dev_start(port);
    if (r != 0) return r;
    /* Not every virtual device supports promiscuous mode; that is fine. */
    (void)rte_eth_promiscuous_enable(port);
    return 0;
}

int sl_port_stop(uint16_t port) {
    int r = rte_eth_dev_stop(port);
    if (r != 0) return r;
    return rte_eth_dev_close(port);
}

/* Port counters from the device. */
/* 1 when the port's link is up, 0 when down, negative on error. */
int sl_port_link_up(uint16_t port) {
    struct rte_eth_link link;
    memset(&link, 0, sizeof(link));
    int r = rte_eth_link_get_nowait(port, &link);
    if (r != 0) return r;
    return link.link_status == RTE_ETH_LINK_UP ? 1 : 0;
}

struct sl_port_stats {
    uint64_t ipackets, opackets, ibytes, obytes, imissed, ierrors, oerrors, rx_nombuf;
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
    return 0;
}

uint16_t sl_rx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    return rte_eth_rx_burst(port, queue, pkts, n);
}

uint16_t sl_tx_burst(uint16_t port, uint16_t queue, struct rte_mbuf **pkts, uint16_t n) {
    return rte_eth_tx_burst(port, queue, pkts, n);
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
