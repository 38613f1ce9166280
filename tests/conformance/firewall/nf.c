/* A stateful firewall: connections from inside (`inside=<IPv4 CIDR>` in
 * the config) may go out, and their replies come back; ARP passes (the
 * hosts on a link must find each other's addresses to talk at all);
 * anything else is dropped. Each allowed flow keeps one byte of per-flow
 * state; a TCP RST forgets it. */
#include <sluice_nf.h>

static uint32_t inside_net, inside_mask;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    size_t vlen;
    const char *v = sluice_config_get(config, len, "inside", &vlen);
    if (!v) return sluice_fail(err, "config: missing inside=<IPv4 CIDR>");
    if (!sluice_parse_ipv4_cidr(v, vlen, &inside_net, &inside_mask))
        return sluice_fail(err, "config: inside: bad IPv4 CIDR '%.*s'", (int)vlen, v);
    inside_net &= inside_mask;
    info->wants_flow_state = true;
    return true;
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    static const uint8_t allowed = 1;
    for (uint32_t i = 0; i < sluice_batch_len(batch); i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        bool from_inside = sluice_is_ipv4(&p) && (sluice_ipv4_src(&p) & inside_mask) == inside_net;
        bool rst = sluice_tcp_flags(&p) & SLUICE_TCP_RST;
        uint32_t state_len;
        if (p.flow == SLUICE_NO_FLOW) {
            /* Not IP: ARP (EtherType 0x0806) passes, the rest drops. */
            bool arp = p.len >= 14 && p.data[12] == 0x08 && p.data[13] == 0x06;
            if (!arp) sluice_set_verdict(batch, i, SLUICE_DROP);
        } else if (sluice_flow_state(batch, p.flow, &state_len)) {
            if (rst) sluice_remove_flow_state(batch, p.flow);
        } else if (from_inside) {
            if (!sluice_set_flow_state(batch, p.flow, &allowed, 1)) return sluice_fail(err, "out of memory");
            if (rst) sluice_remove_flow_state(batch, p.flow);
        } else {
            sluice_set_verdict(batch, i, SLUICE_DROP);
        }
    }
    return true;
}
