/* A stateful firewall that offloads established flows: connections from
 * inside (`inside=<IPv4 CIDR>`) may go out and their replies come back;
 * anything else is dropped; a TCP RST forgets the flow's one byte of
 * state. With `dscp=<0..63>` every forwarded packet gets that DSCP (the
 * IPv4 header checksum updated incrementally). Forwarded packets and their
 * bytes on the wire are counted in the eventual counter table `forwarded`
 * (key 0: packets, key 1: bytes), one counter-add per batch.
 *
 * With `offload=true`, a forwarded TCP or UDP packet of a flow that had
 * state before it, carrying none of SYN, FIN, RST, has its flow offloaded
 * in its direction (the same DSCP change, counts returned), and the
 * packets and bytes of every ended entry are added to `forwarded`: the
 * output and the table are the same with offload and without. With
 * `offload-after=<n>` a direction is offloaded at its nth such packet
 * (default 1: at its first), counted with sluice_admit.
 * A FIN marks the flow closing (state byte 2): nothing of it is
 * offloaded after that; a SYN on it opens it again. */
#include <sluice_nf.h>

static uint32_t inside_net, inside_mask;
static int64_t dscp;
static bool offload;
static sluice_table_t forwarded;
static sluice_rewrite_op_t set_dscp;
static sluice_admission_t *gate;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    size_t vlen;
    const char *v = sluice_config_get(config, len, "inside", &vlen);
    if (!v) return sluice_fail(err, "config: missing inside=<IPv4 CIDR>");
    if (!sluice_parse_ipv4_cidr(v, vlen, &inside_net, &inside_mask))
        return sluice_fail(err, "config: inside: bad IPv4 CIDR '%.*s'", (int)vlen, v);
    inside_net &= inside_mask;
    if (!sluice_config_int(config, len, "dscp", -1, &dscp, err)) return false;
    if (dscp < -1 || dscp > 63) return sluice_fail(err, "config: dscp = %lld: not 0 to 63", (long long)dscp);
    if (!sluice_config_bool(config, len, "offload", false, &offload, err)) return false;
    int64_t after;
    if (!sluice_config_int(config, len, "offload-after", 1, &after, err)) return false;
    if (after < 0 || after > 1000000)
        return sluice_fail(err, "config: offload-after = %lld: not 0 to 1000000", (long long)after);
    sluice_admission_free(gate);
    gate = sluice_admission_new((uint32_t)after, 4096);
    if (!gate) return sluice_fail(err, "out of memory");
    if (dscp >= 0) set_dscp = sluice_op_set_dscp((uint8_t)dscp);
    info->wants_flow_state = true;
    return sluice_declare_sum_counter("forwarded", 0, &forwarded, err);
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    /* A flow's state: allowed, and allowed with a FIN seen (no offload
     * from then on: what is left of the connection is a few packets). */
    static const uint8_t allowed = 1, closing_state = 2;
    int64_t packets = 0, bytes = 0;
    size_t nret;
    const sluice_offload_return_t *ret = sluice_offload_returns(batch, &nret);
    for (size_t k = 0; k < nret; k++) {
        packets += (int64_t)ret[k].packets;
        bytes += (int64_t)ret[k].bytes;
    }
    sluice_offload_t entry = {0};
    if (dscp >= 0) entry.rewrites = &set_dscp, entry.nrewrites = 1;
    for (uint32_t i = 0; i < sluice_batch_len(batch); i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (p.flow == SLUICE_NO_FLOW) {
            sluice_set_verdict(batch, i, SLUICE_DROP);
            continue;
        }
        uint8_t flags = sluice_tcp_flags(&p);
        uint32_t state_len;
        const uint8_t *state = sluice_flow_state(batch, p.flow, &state_len);
        bool known = state != NULL, closing = known && state_len > 0 && state[0] == closing_state;
        if (known) {
            if (flags & SLUICE_TCP_RST) sluice_remove_flow_state(batch, p.flow);
            if (flags & SLUICE_TCP_SYN) {
                /* A new connection on the flow's 5-tuple. */
                if (closing && !sluice_set_flow_state(batch, p.flow, &allowed, 1))
                    return sluice_fail(err, "out of memory");
                sluice_admission_forget(gate, &p);
            } else if ((flags & SLUICE_TCP_FIN) && !closing &&
                       !sluice_set_flow_state(batch, p.flow, &closing_state, 1)) {
                return sluice_fail(err, "out of memory");
            }
        } else if (sluice_is_ipv4(&p) && (sluice_ipv4_src(&p) & inside_mask) == inside_net) {
            if (!sluice_set_flow_state(batch, p.flow, &allowed, 1)) return sluice_fail(err, "out of memory");
            sluice_admission_forget(gate, &p);
            if (flags & SLUICE_TCP_RST) sluice_remove_flow_state(batch, p.flow);
        } else {
            sluice_set_verdict(batch, i, SLUICE_DROP);
            continue;
        }
        packets++;
        bytes += p.wire_len;
        if (dscp >= 0 && sluice_is_ipv4(&p)) {
            uint8_t *d = sluice_rewrite(batch, i);
            if (!d) return sluice_fail(err, "out of memory");
            size_t l3 = p.l3_offset;
            uint16_t old = sluice_be16(d, p.len, l3);
            d[l3 + 1] = (uint8_t)((dscp << 2) | (d[l3 + 1] & 3));
            uint16_t sum = sluice_csum_update16(sluice_be16(d, p.len, l3 + 10), old, sluice_be16(d, p.len, l3));
            sluice_put_be16(d, p.len, l3 + 10, sum);
        }
        bool plain_tcp = sluice_is_tcp(&p) && !(flags & (SLUICE_TCP_SYN | SLUICE_TCP_FIN | SLUICE_TCP_RST));
        if (offload && known && !closing && (sluice_is_udp(&p) || plain_tcp) && sluice_admit(gate, &p) &&
            !sluice_offload(batch, i, &entry))
            return sluice_fail(err, "out of memory");
    }
    uint64_t keys[2] = {0, 1};
    int64_t deltas[2] = {packets, bytes};
    return packets == 0 || sluice_counter_add(forwarded, keys, deltas, 2, err);
}
