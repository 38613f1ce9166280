/*
 * sluice_nf.h: write Sluice network functions in C.
 *
 * An NF defines two functions (and optionally a third):
 *
 *   bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err);
 *   bool nf_process(sluice_batch_t *batch, sluice_error_t *err);
 *   bool nf_expired(uint32_t table, const uint8_t *entries, size_t len, sluice_error_t *err);
 *
 * The host calls nf_init once per instance with the tenant's configuration
 * and nf_process once per batch of packets. Inside nf_process, the batch
 * gives packet views, per-flow state (including changes made earlier in the
 * same batch), and setters for verdicts, rewrites and state; every packet
 * starts with the verdict "forward to port 0". None of those calls the
 * host: a batch costs one call however many packets it holds. Return false
 * (after sluice_fail) to refuse a config or fail a batch.
 *
 * Everything here is bounds-checked: an accessor on a packet too short for
 * the header returns 0 or false, never reads past the packet.
 *
 * The contract is wit/v0.3.0/nf.wit (sluice:nf@0.3.0); gen/ holds the
 * wit-bindgen bindings this header wraps.
 */
#ifndef SLUICE_NF_H
#define SLUICE_NF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "network_function.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- verdicts ----------------------------------------------------------- */

/* Drop the packet. */
#define SLUICE_DROP 0u
/* Forward the packet out of `port` (0: the default output). */
static inline uint32_t sluice_forward(uint16_t port) { return (1u << 16) | port; }
/* Send the packet to the chain branch selected by `label`. */
static inline uint32_t sluice_label(uint16_t label) { return (2u << 16) | label; }

/* ---- log levels --------------------------------------------------------- */

#define SLUICE_DEBUG SLUICE_NF_TYPES_LEVEL_DEBUG
#define SLUICE_INFO SLUICE_NF_TYPES_LEVEL_INFO
#define SLUICE_WARN SLUICE_NF_TYPES_LEVEL_WARN
#define SLUICE_ERROR SLUICE_NF_TYPES_LEVEL_ERROR

/* ---- errors ------------------------------------------------------------- */

/* The message of a refused config or a failed batch. */
typedef struct {
    char message[256];
} sluice_error_t;

/* Formats the message into `err` and returns false, so that an NF can
 * `return sluice_fail(err, "rule %d: bad CIDR", n);`. */
bool sluice_fail(sluice_error_t *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* ---- init --------------------------------------------------------------- */

/* What nf_init tells the host (zeroed before nf_init runs). */
typedef struct {
    /* Hand in per-flow state with every batch. */
    bool wants_flow_state;
    /* Idle time after which the host forgets a flow's state; 0: 120 s. */
    uint64_t flow_idle_timeout_ns;
} sluice_info_t;

/* Finds `key` in a config of `key=value` lines (spaces around both are
 * ignored, `#` starts a comment line). Returns the value (not
 * NUL-terminated) and its length in *len, or NULL. */
const char *sluice_config_get(const uint8_t *config, size_t config_len, const char *key, size_t *len);

/* Parses "a.b.c.d" or "a.b.c.d/n" (n defaults to 32) into a host-order
 * address and mask. */
bool sluice_parse_ipv4_cidr(const char *text, size_t len, uint32_t *addr, uint32_t *mask);

/* ---- packets ------------------------------------------------------------ */

/* No flow (not IP). */
#define SLUICE_NO_FLOW 0xffffu
/* Descriptor flags. */
#define SLUICE_FLAG_REVERSE 1u
#define SLUICE_FLAG_FRAGMENT 2u
#define SLUICE_FLAG_TRUNCATED 4u
#define SLUICE_FLAG_IPV6 8u

/* One packet of a batch: its bytes and what the host parsed out of them. */
typedef struct {
    const uint8_t *data;
    uint32_t len;
    uint32_t wire_len;
    uint64_t timestamp_ns;
    uint64_t flow_hash;
    /* Index of the packet's flow in the batch, or SLUICE_NO_FLOW. */
    uint32_t flow;
    uint16_t ingress_port;
    /* Offset of the TCP/UDP/ICMP header, 0xffff if absent. */
    uint16_t l4_offset;
    /* Offset of the IP header, 0xff if none. */
    uint8_t l3_offset;
    uint8_t flags;
} sluice_packet_t;

typedef struct sluice_batch sluice_batch_t;

/* Number of packets in the batch. */
uint32_t sluice_batch_len(const sluice_batch_t *b);
/* Packet `i` (0 <= i < len); out of range gives an empty packet. */
sluice_packet_t sluice_batch_packet(const sluice_batch_t *b, uint32_t i);

/* An IPv4 packet whose whole IP header was captured. */
bool sluice_is_ipv4(const sluice_packet_t *p);
/* A TCP packet whose whole TCP header (options included) was captured. */
bool sluice_is_tcp(const sluice_packet_t *p);
/* A UDP packet whose UDP header was captured. */
bool sluice_is_udp(const sluice_packet_t *p);
/* The IP protocol (6 TCP, 17 UDP, 1 ICMP, ...; for IPv6 the first next
 * header), 0 if not IP. */
uint8_t sluice_ip_proto(const sluice_packet_t *p);
/* IPv4 source and destination, host byte order (0 if not IPv4). */
uint32_t sluice_ipv4_src(const sluice_packet_t *p);
uint32_t sluice_ipv4_dst(const sluice_packet_t *p);
/* TCP/UDP ports (0 if absent). */
uint16_t sluice_src_port(const sluice_packet_t *p);
uint16_t sluice_dst_port(const sluice_packet_t *p);
/* TCP flags byte (FIN 0x01, SYN 0x02, RST 0x04, ACK 0x10), 0 if not TCP. */
uint8_t sluice_tcp_flags(const sluice_packet_t *p);
#define SLUICE_TCP_FIN 0x01u
#define SLUICE_TCP_SYN 0x02u
#define SLUICE_TCP_RST 0x04u
#define SLUICE_TCP_ACK 0x10u

/* Big-endian loads and stores, bounds-checked against `len`. */
uint16_t sluice_be16(const uint8_t *data, size_t len, size_t at);
uint32_t sluice_be32(const uint8_t *data, size_t len, size_t at);
bool sluice_put_be16(uint8_t *data, size_t len, size_t at, uint16_t v);

/* RFC 1624 incremental update of a one's-complement checksum `sum` when a
 * 16-bit word changes from `old_word` to `new_word`. */
uint16_t sluice_csum_update16(uint16_t sum, uint16_t old_word, uint16_t new_word);

/* ---- decisions ---------------------------------------------------------- */

void sluice_set_verdict(sluice_batch_t *b, uint32_t i, uint32_t verdict);
uint32_t sluice_verdict(const sluice_batch_t *b, uint32_t i);

/* A writable copy of packet i's bytes (its length is the packet's); the
 * copy replaces the packet when the batch ends. NULL if out of range or out
 * of memory. Calling it again returns the same copy. */
uint8_t *sluice_rewrite(sluice_batch_t *b, uint32_t i);

/* ---- per-flow state ----------------------------------------------------- */

/* The state of `flow` as of now (what the host handed in, or what this
 * batch set since); NULL with *len = 0 if none. */
const uint8_t *sluice_flow_state(const sluice_batch_t *b, uint32_t flow, uint32_t *len);
/* Stores `len` bytes (1..4096) for `flow`; false if out of memory. */
bool sluice_set_flow_state(sluice_batch_t *b, uint32_t flow, const void *data, uint32_t len);
/* Forgets the state of `flow`. */
void sluice_remove_flow_state(sluice_batch_t *b, uint32_t flow);

/* ---- log and events ----------------------------------------------------- */

/* A line in the host log. */
void sluice_log(uint8_t level, const char *message);

/* Queues an event (sent in one call when the batch ends). `packet` is the
 * packet's index or -1; `fields` holds `nfields` key, value string pairs.
 * Strings are copied. */
bool sluice_event(sluice_batch_t *b, const char *kind, uint8_t level, int64_t packet, const char *const *fields,
                  size_t nfields);

/* Sends one event now, outside a batch (e.g. from nf_expired). */
bool sluice_emit(const char *kind, uint8_t level, const char *const *fields, size_t nfields);

/* ---- host tables (see the `state` interface in the WIT) ----------------- */

typedef uint32_t sluice_table_t;

/* Declares a global counter table whose workers' replicas are summed every
 * `merge_interval_ns` of packet time (only in nf_init). */
bool sluice_declare_sum_counter(const char *name, uint64_t merge_interval_ns, sluice_table_t *table,
                                sluice_error_t *err);
/* Declares any table from a full spec (only in nf_init). */
bool sluice_declare(sluice_nf_state_table_spec_t *spec, sluice_table_t *table, sluice_error_t *err);
/* Adds deltas[i] to the counter keys[i]. */
bool sluice_counter_add(sluice_table_t table, uint64_t *keys, int64_t *deltas, size_t n, sluice_error_t *err);
/* Reads n counters into out. */
bool sluice_counter_get(sluice_table_t table, uint64_t *keys, uint64_t *out, size_t n, sluice_error_t *err);

/* Keys and values of byte tables and pools travel framed: a 4-byte
 * little-endian length, then the bytes, for each item. A growable buffer
 * to build such lists (free with sluice_buf_free): */
typedef struct {
    uint8_t *ptr;
    size_t len, cap;
} sluice_buf_t;
bool sluice_frame_push(sluice_buf_t *b, const void *item, uint32_t len);
void sluice_buf_free(sluice_buf_t *b);
/* Reads the item at *at of a framed list and advances *at; false at the
 * end or if the framing is cut short. */
bool sluice_frame_next(const uint8_t *data, size_t len, size_t *at, const uint8_t **item, uint32_t *item_len);

/* Declares byte values per flow, keyed by the batch's flow index framed
 * as 4 bytes little-endian (only in nf_init). */
bool sluice_declare_per_flow_bytes(const char *name, uint32_t max_value_size, sluice_table_t *table,
                                   sluice_error_t *err);
/* The same with an idle timeout (packet time); with notify_expired, the
 * host hands expired entries to nf_expired (key: the 37-byte flow key). */
bool sluice_declare_per_flow_bytes_expiring(const char *name, uint32_t max_value_size, uint64_t idle_timeout_ns,
                                            bool notify_expired, sluice_table_t *table, sluice_error_t *err);
/* Declares a global counter table with one owner worker per key
 * (single-writer consistency, only in nf_init): adds to keys another
 * worker owns are forwarded to it as deltas, so none is lost; reads see
 * the owner's value as published at its last sync plus this worker's own
 * adds since. Owners sync every `sync_interval_ns` of packet time (0:
 * every batch). */
bool sluice_declare_single_writer_counter(const char *name, uint64_t sync_interval_ns, sluice_table_t *table,
                                          sluice_error_t *err);
/* Declares a global byte table with one owner worker per key
 * (single-writer consistency, only in nf_init): writes to keys another
 * worker owns are forwarded to it, and the last applied write wins (an
 * empty value removes); reads see the owner's value as published at its
 * last sync plus this worker's own writes since. `key_size` 0 allows keys
 * of 1 to 256 bytes; owners sync every `sync_interval_ns` of packet time
 * (0: every batch). */
bool sluice_declare_single_writer_bytes(const char *name, uint32_t key_size, uint32_t max_value_size,
                                        uint64_t sync_interval_ns, sluice_table_t *table, sluice_error_t *err);
/* Declares a pool of the resources first .. first + count, each bound to
 * a value of up to max_value_size bytes while held (only in nf_init). */
bool sluice_declare_pool(const char *name, uint64_t first, uint64_t count, uint32_t max_value_size,
                         sluice_table_t *table, sluice_error_t *err);
/* Reads values for framed keys; *out (framed, in key order) is malloc'd:
 * free(out->ptr). */
bool sluice_get_many(sluice_table_t table, const uint8_t *keys, size_t len, sluice_buf_t *out, sluice_error_t *err);
/* Writes framed key, value, ... (an empty value removes the key). */
bool sluice_put_many(sluice_table_t table, const uint8_t *entries, size_t len, sluice_error_t *err);
/* Takes one resource per framed value; *ids is malloc'd (free(*ids)), *n
 * may be less than asked when the pool is exhausted. */
bool sluice_acquire(sluice_table_t table, const uint8_t *values, size_t len, uint64_t **ids, size_t *n,
                    sluice_error_t *err);
/* The values bound to resources, framed; free(out->ptr). */
bool sluice_lookup(sluice_table_t table, uint64_t *ids, size_t n, sluice_buf_t *out, sluice_error_t *err);
/* Gives resources back. */
bool sluice_release(sluice_table_t table, uint64_t *ids, size_t n, sluice_error_t *err);

/* ---- what the NF defines ------------------------------------------------ */

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err);
bool nf_process(sluice_batch_t *batch, sluice_error_t *err);
/* Optional: tables declared with notify-expired. The default ignores them. */
bool nf_expired(uint32_t table, const uint8_t *entries, size_t len, sluice_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_NF_H */
