/* Port knocking on a single-writer byte table `stage` (key-size 4: the
 * IPv4 source address in network order; max-value-size 1;
 * sync-interval-ns 10,000,000): a source that sends TCP SYNs to ports
 * 7000, 8000 and 9000, in that order, may then open connections to port
 * 22. A TCP packet is an IPv4 packet whose whole TCP header was
 * captured; a knock is a TCP SYN without ACK. Each knock, in packet
 * order, reads its source's stage s with one `get-many` (0 when absent,
 * else the value's byte), then: to port 22, it is forwarded when s is 3
 * and dropped otherwise; to port 7000, 8000 or 9000 when that is the
 * next port of the sequence (s < 3 and the port is the (s+1)-th), one
 * `put-many` sets the stage to s + 1; to any other port while 0 < s < 3,
 * one `put-many` removes the key (an empty value: the sequence starts
 * over). Knocks to other ports than 22 are forwarded; every other packet
 * is forwarded and touches no table. A stage of 3 stays. Each packet sees
 * the writes of the packets before it, in the same batch too. */
#include <sluice_nf.h>

/* The ports to knock on, in order; the stage of a source that knocked
 * them all; the port they open. */
static const uint16_t SEQUENCE[3] = {7000, 8000, 9000};
#define OPENED 3
#define GUARDED 22

static sluice_table_t stage;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)config, (void)len, (void)info;
    return sluice_declare_single_writer_bytes("stage", 4, 1, 10 * 1000 * 1000, &stage, err);
}

static void be32(uint8_t *b, uint32_t v) { b[0] = (uint8_t)(v >> 24), b[1] = (uint8_t)(v >> 16), b[2] = (uint8_t)(v >> 8), b[3] = (uint8_t)v; }

/* The stage of `key` (a source in network order): one get-many. */
static bool stage_of(const uint8_t key[4], uint8_t *s, sluice_error_t *err) {
    sluice_buf_t keys = {0}, values = {0};
    bool ok = sluice_frame_push(&keys, key, 4) || sluice_fail(err, "out of memory");
    if (ok) ok = sluice_get_many(stage, keys.ptr, keys.len, &values, err);
    *s = 0;
    if (ok) {
        size_t at = 0;
        const uint8_t *v;
        uint32_t vlen;
        if (sluice_frame_next(values.ptr, values.len, &at, &v, &vlen) && vlen > 0) *s = v[0];
        else if (at < values.len) ok = sluice_fail(err, "bad framing at 0");
    }
    sluice_buf_free(&keys), sluice_buf_free(&values);
    return ok;
}

/* Sets the stage of `key` to `value` (vlen 0: removes it): one put-many. */
static bool set_stage(const uint8_t key[4], const uint8_t *value, uint32_t vlen, sluice_error_t *err) {
    sluice_buf_t entries = {0};
    bool ok = (sluice_frame_push(&entries, key, 4) && sluice_frame_push(&entries, value, vlen)) ||
              sluice_fail(err, "out of memory");
    if (ok) ok = sluice_put_many(stage, entries.ptr, entries.len, err);
    sluice_buf_free(&entries);
    return ok;
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    uint32_t n = sluice_batch_len(batch);
    for (uint32_t i = 0; i < n; i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (!sluice_is_ipv4(&p) || !sluice_is_tcp(&p)) continue;
        uint8_t flags = sluice_tcp_flags(&p);
        if (!(flags & SLUICE_TCP_SYN) || (flags & SLUICE_TCP_ACK)) continue;
        uint8_t src[4], s;
        be32(src, sluice_ipv4_src(&p));
        if (!stage_of(src, &s, err)) return false;
        uint16_t port = sluice_dst_port(&p);
        if (port == GUARDED) {
            if (s != OPENED) sluice_set_verdict(batch, i, SLUICE_DROP);
        } else if (s < OPENED && SEQUENCE[s] == port) {
            uint8_t next = (uint8_t)(s + 1);
            if (!set_stage(src, &next, 1, err)) return false;
        } else if (s > 0 && s < OPENED) {
            if (!set_stage(src, NULL, 0, err)) return false;
        }
    }
    return true;
}
