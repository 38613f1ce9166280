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
 * The contract is wit/v0.6.0/nf.wit (sluice:nf@0.6.0); gen/ holds the
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

/* Why a call failed: the message of a refused config or a failed batch,
 * and, after a failed table call, which state error the host returned
 * and the index of the item it refused. */
typedef struct {
    char message[256];
    /* Set by a failed table call (sluice_declare*, sluice_counter_add, ...):
     * one of SLUICE_STATE_ERR_*; SLUICE_STATE_OK (0) when no table call
     * has failed. */
    uint8_t state_error;
    /* For SLUICE_STATE_ERR_BAD_INPUT, _FULL, _OVER_BUDGET and _TOO_LARGE:
     * the index of the item the call stopped at (the key of
     * sluice_counter_add, the key-value entry of sluice_put_many, the
     * value of sluice_acquire). The items before it were applied; it and
     * the ones after it were not. -1 for the other state errors. */
    int64_t item;
} sluice_error_t;

/* sluice_error_t.state_error: the cases of the contract's state-error. */
#define SLUICE_STATE_OK 0u
/* No table with this handle was declared. */
#define SLUICE_STATE_ERR_UNKNOWN_TABLE 1u
/* A declaration outside nf_init, or a write to a read-only table there. */
#define SLUICE_STATE_ERR_NOT_NOW 2u
/* The call does not fit the table (sluice_counter_add on a byte table). */
#define SLUICE_STATE_ERR_WRONG_KIND 3u
/* The spec is invalid; the message says which field and why. */
#define SLUICE_STATE_ERR_BAD_SPEC 4u
/* A table of this name exists with another layout; the message says what. */
#define SLUICE_STATE_ERR_INCOMPATIBLE 5u
/* A malformed item (framing, key length, flow index, list lengths) at `item`. */
#define SLUICE_STATE_ERR_BAD_INPUT 6u
/* The table is at its capacity: stopped at `item`. */
#define SLUICE_STATE_ERR_FULL 7u
/* The NF's state budget is used up: stopped at `item`. */
#define SLUICE_STATE_ERR_OVER_BUDGET 8u
/* A value longer than the table's max_value_size, at `item`. */
#define SLUICE_STATE_ERR_TOO_LARGE 9u

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
 * ignored, `#` starts a comment line, the first line with the key wins).
 * Returns the value (not NUL-terminated) and its length in *len, or NULL. */
const char *sluice_config_get(const uint8_t *config, size_t config_len, const char *key, size_t *len);

/* Typed config values: each stores the value of `key` in *out, or `def`
 * when the config has no such key, and returns true. A value it cannot
 * read makes it return false with a message naming the key and the value
 * in err (e.g. "capacity = 12k: not an integer"), ready to be returned
 * from nf_init. The same values are accepted by every SDK. */
/* Decimal digits with an optional sign ("30000", "-7", "+3") that fit an
 * int64_t. Errors: "not an integer", "integer out of range". */
bool sluice_config_int(const uint8_t *config, size_t config_len, const char *key, int64_t def, int64_t *out,
                       sluice_error_t *err);
/* A decimal number with an optional sign, fraction and exponent ("1.5",
 * ".5", "2e-3", "3"); not "inf", "nan", hexadecimal, or a value too large
 * for a double. Errors: "not a number". */
bool sluice_config_float(const uint8_t *config, size_t config_len, const char *key, double def, double *out,
                         sluice_error_t *err);
/* true/false, yes/no, on/off, 1/0, in any case. Errors: "not a boolean". */
bool sluice_config_bool(const uint8_t *config, size_t config_len, const char *key, bool def, bool *out,
                        sluice_error_t *err);
/* The value (or `def`; NULL is "") copied into out[0..out_size) and
 * NUL-terminated. Errors: "longer than N bytes" when it does not fit. */
bool sluice_config_string(const uint8_t *config, size_t config_len, const char *key, const char *def, char *out,
                          size_t out_size, sluice_error_t *err);

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
/* An IPv6 packet whose fixed 40-byte IP header was captured. */
bool sluice_is_ipv6(const sluice_packet_t *p);
/* IPv6 source and destination: copy the 16 address bytes (network order)
 * into out and return true; if not IPv6, zero out and return false. */
bool sluice_ipv6_src(const sluice_packet_t *p, uint8_t out[16]);
bool sluice_ipv6_dst(const sluice_packet_t *p, uint8_t out[16]);
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

/* A table as the NF declares it: the contract's table-spec record (every
 * field is documented in gen/network_function.h and wit/v0.6.0/nf.wit). */
typedef sluice_nf_state_table_spec_t sluice_table_spec_t;

/* How the replicas of an eventual table combine. */
#define SLUICE_MERGE_SUM SLUICE_NF_STATE_MERGE_SUM
#define SLUICE_MERGE_MAX SLUICE_NF_STATE_MERGE_MAX
#define SLUICE_MERGE_MIN SLUICE_NF_STATE_MERGE_MIN

/* Spec constructors: each fills *spec for one kind of table the contract
 * allows, with capacity 0 (the host's default, 65536 entries), no idle
 * timeout and no expiry notification. Set spec->capacity,
 * spec->idle_timeout_ns and spec->notify_expired after it, then declare
 * the table with sluice_declare. `name` (1-64 characters of a-z 0-9 - _ .)
 * is not copied: it must stay valid until sluice_declare returns. */
/* Counters per flow, keyed by the batch's flow index. */
void sluice_spec_per_flow_counter(sluice_table_spec_t *spec, const char *name);
/* Byte values per flow, keyed by the batch's flow index framed as 4 bytes
 * little-endian. */
void sluice_spec_per_flow_bytes(sluice_table_spec_t *spec, const char *name, uint32_t max_value_size);
/* Global counters written in nf_init and replicated to every worker. */
void sluice_spec_read_only_counter(sluice_table_spec_t *spec, const char *name);
/* Global byte values written in nf_init and replicated to every worker;
 * key_size 0 allows keys of 1 to 256 bytes. */
void sluice_spec_read_only_bytes(sluice_table_spec_t *spec, const char *name, uint32_t key_size,
                                 uint32_t max_value_size);
/* Global counters, one replica per worker, merged with `merge`
 * (SLUICE_MERGE_SUM, _MAX, _MIN) every merge_interval_ns of packet time
 * (0: every batch). */
void sluice_spec_eventual_counter(sluice_table_spec_t *spec, const char *name, uint8_t merge,
                                  uint64_t merge_interval_ns);
/* Global counters with one owner worker per key, synced every
 * sync_interval_ns of packet time (see sluice_declare_single_writer_counter). */
void sluice_spec_single_writer_counter(sluice_table_spec_t *spec, const char *name, uint64_t sync_interval_ns);
/* Global byte values with one owner worker per key (see
 * sluice_declare_single_writer_bytes); key_size 0 allows keys of 1 to 256
 * bytes. */
void sluice_spec_single_writer_bytes(sluice_table_spec_t *spec, const char *name, uint32_t key_size,
                                     uint32_t max_value_size, uint64_t sync_interval_ns);
/* A pool of the resources first .. first + count split between workers
 * (release consistency), each bound to a value of up to max_value_size
 * bytes while held; spec->consistency.val.release.chunk sets how many a
 * worker takes at a time (0: the host chooses). Pools take no idle
 * timeout, and a capacity below `count` is refused. */
void sluice_spec_pool(sluice_table_spec_t *spec, const char *name, uint64_t first, uint64_t count,
                      uint32_t max_value_size);

/* Declares a global counter table whose workers' replicas are summed every
 * `merge_interval_ns` of packet time (only in nf_init). For a capacity or
 * an idle timeout, use sluice_spec_eventual_counter and sluice_declare. */
bool sluice_declare_sum_counter(const char *name, uint64_t merge_interval_ns, sluice_table_t *table,
                                sluice_error_t *err);
/* Declares any table from a full spec (only in nf_init), or finds the one
 * this NF declared earlier under the same name. Errors (in err):
 * SLUICE_STATE_ERR_NOT_NOW outside nf_init, _BAD_SPEC for an invalid spec,
 * _INCOMPATIBLE when the name exists with another scope, access, kind or
 * consistency. */
bool sluice_declare(sluice_nf_state_table_spec_t *spec, sluice_table_t *table, sluice_error_t *err);
/* Adds deltas[i] to the counter keys[i] (for max/min eventual tables:
 * offers the value). Errors: _WRONG_KIND, _NOT_NOW (a read-only table
 * outside nf_init), _BAD_INPUT, _FULL, _OVER_BUDGET, with err->item the
 * index of the key the call stopped at (keys before it were added). */
bool sluice_counter_add(sluice_table_t table, uint64_t *keys, int64_t *deltas, size_t n, sluice_error_t *err);
/* Reads n counters into out (0 for absent keys). */
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
/* Writes framed key, value, ... (an empty value removes the key).
 * Errors: _WRONG_KIND, _NOT_NOW, _BAD_INPUT, _TOO_LARGE, _FULL,
 * _OVER_BUDGET, with err->item the index of the key-value entry the call
 * stopped at (entries before it were written). */
bool sluice_put_many(sluice_table_t table, const uint8_t *entries, size_t len, sluice_error_t *err);
/* Takes one resource per framed value; *ids is malloc'd (free(*ids)), *n
 * may be less than asked when the pool is exhausted. Errors: _WRONG_KIND,
 * _BAD_INPUT, _TOO_LARGE, with err->item the index of the value. */
bool sluice_acquire(sluice_table_t table, const uint8_t *values, size_t len, uint64_t **ids, size_t *n,
                    sluice_error_t *err);
/* The values bound to resources, framed; free(out->ptr). */
bool sluice_lookup(sluice_table_t table, uint64_t *ids, size_t n, sluice_buf_t *out, sluice_error_t *err);
/* Gives resources back. */
bool sluice_release(sluice_table_t table, uint64_t *ids, size_t n, sluice_error_t *err);

/* ---- listing a table (sluice:nf@0.4.0) ----------------------------------- */

/* The most entries one sluice_scan page and one sluice_top_k hold (the
 * host's bound on `limit` and `k`). */
#define SLUICE_SCAN_MAX 1024
/* One counter of a table: its key and value. */
typedef struct {
    uint64_t key, value;
} sluice_counter_entry_t;
/* One page of sluice_scan, in ascending key order (free with
 * sluice_scan_page_free). */
typedef struct {
    /* Counter tables: the page's counters (none for other tables). */
    sluice_counter_entry_t *counters;
    size_t n_counters;
    /* Byte tables: framed key, value, key, value, ... (keys ascending
     * bytewise); pools: each held resource as a framed 8-byte
     * little-endian resource and its framed value. Empty for counters. */
    sluice_buf_t entries;
    /* Pass it as the next call's cursor; len 0 when the scan is done. */
    sluice_buf_t cursor;
} sluice_scan_page_t;
/* One page of a table: up to `limit` entries whose key comes after
 * `cursor` (len 0: from the start; `limit` 0 or above SLUICE_SCAN_MAX:
 * SLUICE_SCAN_MAX), and the cursor of the next page in page->cursor
 * (len 0: done). Costs one state operation per entry plus one per call.
 * Errors: _WRONG_KIND for a per-flow table, _BAD_INPUT for a cursor that
 * is no key of the table. */
bool sluice_scan(sluice_table_t table, const uint8_t *cursor, size_t cursor_len, uint32_t limit,
                 sluice_scan_page_t *page, sluice_error_t *err);
/* Frees what sluice_scan put in a page. */
void sluice_scan_page_free(sluice_scan_page_t *page);
/* The `k` (at most SLUICE_SCAN_MAX) largest counters of a counter table
 * into out (room for k), largest first, equal values by ascending key;
 * *n is how many (fewer when the table holds fewer). The host selects
 * them without the NF reading every key. Errors: _WRONG_KIND for byte,
 * pool and per-flow tables. */
bool sluice_top_k(sluice_table_t table, uint32_t k, sluice_counter_entry_t *out, size_t *n, sluice_error_t *err);

/* ---- flow offload (sluice:nf@0.5.0) ------------------------------------- */

/* Once the NF has decided a flow, the host can give the flow's later
 * packets the same verdict and header changes itself, without calling the
 * NF. sluice_offload asks for it with a packet of the batch: its flow, in
 * its direction and from its ingress port, gets this packet's verdict from
 * when nf_process returns, plus the changes listed (the packet itself is
 * changed only by what the batch rewrites, as usual). Offload each
 * direction with a packet that travels it. An entry ends, and that packet
 * comes to the NF, on a TCP FIN or RST, at its packet or byte limit, or
 * when a TTL is too low to lower; it also ends when idle, revoked or when
 * the NF is replaced. What passed under it comes back with a later batch
 * (sluice_offload_returns), so counters the NF keeps can end equal to a
 * run without offload. A chain skips its NFs for a packet only where every
 * NF it went through offloaded it in the same batch. An NF that must see
 * every packet (an IDS, a rate limiter) does not offload. Each entry is
 * charged 256 bytes against the NF's state budget. */

/* A change an offload entry makes to each later packet (build it with the
 * sluice_op_* functions). */
typedef sluice_nf_offload_rewrite_op_t sluice_rewrite_op_t;
/* Later packets get this sender address (4 or 16 bytes, not copied: keep
 * it valid until nf_process returns) and, with has_port, this port. */
sluice_rewrite_op_t sluice_op_source(const uint8_t *address, size_t len, bool has_port, uint16_t port);
/* Later packets get this receiver address and, with has_port, this port. */
sluice_rewrite_op_t sluice_op_destination(const uint8_t *address, size_t len, bool has_port, uint16_t port);
/* Later packets have their TTL or hop limit lowered by one. */
sluice_rewrite_op_t sluice_op_decrement_ttl(void);
/* Later packets get this DSCP (0 to 63). */
sluice_rewrite_op_t sluice_op_set_dscp(uint8_t dscp);

/* What an offload entry does besides the verdict; a zeroed struct (or
 * NULL) asks for no change, the NF's flow idle timeout, no limits and the
 * counts back. */
typedef struct {
    /* At most 8 changes (copied by sluice_offload). */
    const sluice_rewrite_op_t *rewrites;
    size_t nrewrites;
    /* End after this long without a packet (packet time); 0: the NF's
     * flow idle timeout. */
    uint64_t idle_timeout_ns;
    /* End after this many packets, bytes, or this long after it was made
     * (0: no limit). */
    uint64_t max_packets, max_bytes, max_age_ns;
    /* Ask for nothing back when the entry ends (an NF that counts nothing
     * per packet, e.g. a firewall). */
    bool without_counts;
} sluice_offload_t;

/* Offloads the flow of packet i. The requests go to the host in one call
 * when nf_process returns; a refused one (an IP fragment, a change that
 * does not fit the packet, a full budget) simply makes no entry (call
 * sluice_offload_now to see refusals). False: out of memory. */
bool sluice_offload(sluice_batch_t *b, uint32_t i, const sluice_offload_t *opts);

/* sluice_offload_now's results: the contract's offload-error case plus
 * one, SLUICE_OFFLOAD_OK (0) where an entry was made. */
#define SLUICE_OFFLOAD_OK 0u
/* No entry can be made now (natively, or the chain's first asking batch). */
#define SLUICE_OFFLOAD_ERR_NOT_NOW 1u
/* No such packet in the batch. */
#define SLUICE_OFFLOAD_ERR_BAD_PACKET 2u
/* An IP fragment, not IP, or a packet without a flow. */
#define SLUICE_OFFLOAD_ERR_NOT_OFFLOADABLE 3u
/* A change that does not fit the packet (an address of the other family,
 * more than 8 changes, a DSCP above 63). */
#define SLUICE_OFFLOAD_ERR_BAD_REWRITE 4u
/* The NF's state budget is used up. */
#define SLUICE_OFFLOAD_ERR_OVER_BUDGET 5u
/* Sends the requests queued with sluice_offload now: results[k] (room for
 * as many as were queued, or NULL) is SLUICE_OFFLOAD_OK or the error of
 * the k-th. Returns how many were sent. */
size_t sluice_offload_now(sluice_batch_t *b, uint8_t *results);

/* What passed under an entry that ended: flow (is_some: the flow's index
 * in this batch, when a packet of it is here), flow_hash, key (the flow's
 * key as the host hashes it), reverse (the reply direction), packets,
 * bytes, reason (SLUICE_NF_OFFLOAD_END_REASON_CLOSED, _LIMIT, _IDLE,
 * _REVOKED, _REPLACED). */
typedef sluice_nf_offload_offload_return_t sluice_offload_return_t;
/* The entries of this NF that ended since the last batch, one per entry
 * (*n of them; valid until nf_process returns). Add them to whatever the
 * NF counts per packet. */
const sluice_offload_return_t *sluice_offload_returns(sluice_batch_t *b, size_t *n);
/* Ends this worker's entries of the flows with these hashes
 * (sluice_packet_t.flow_hash), both directions, when the batch is done. */
void sluice_revoke(const uint64_t *flow_hashes, size_t n);
/* Ends every entry of this NF on this worker when the batch is done. */
void sluice_revoke_all(void);

/* Which flow directions have proved long enough to offload: a count of
 * each direction's packets in the instance's own memory. An entry costs the
 * host a request, an install and an end, which a flow that ends a few
 * packets later does not repay; an NF whose call is cheap offloads a
 * direction once it has carried `after` packets it would have offloaded,
 * as flow caches admit only flows that have proved long. The counts live in
 * a table of `slots` flows (a power of two, at least 4, at most 2^20),
 * four ways per hash (a new flow takes the place of the one with the fewest
 * packets there): a count lost to another flow, another worker or a restart
 * only delays the entry. Nothing here changes a verdict. */
typedef struct sluice_admission sluice_admission_t;
/* A table admitting a direction at its `after`th packet (0 and 1: at once,
 * with no table). NULL: out of memory. */
sluice_admission_t *sluice_admission_new(uint32_t after, size_t slots);
/* Counts one packet of p's flow in p's direction (SLUICE_FLAG_REVERSE);
 * true once that direction has carried `after` counted packets. */
bool sluice_admit(sluice_admission_t *a, const sluice_packet_t *p);
/* Forgets the counts of p's flow (a new connection on its 5-tuple). */
void sluice_admission_forget(sluice_admission_t *a, const sluice_packet_t *p);
void sluice_admission_free(sluice_admission_t *a);

/* ---- what the NF defines ------------------------------------------------ */

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err);
bool nf_process(sluice_batch_t *batch, sluice_error_t *err);
/* Optional: tables declared with notify-expired. The default ignores them. */
bool nf_expired(uint32_t table, const uint8_t *entries, size_t len, sluice_error_t *err);

#ifdef __cplusplus
}
#endif

#endif /* SLUICE_NF_H */
