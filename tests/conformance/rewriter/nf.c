/* An IPv4 prefix translator: every address in `from=<CIDR>` becomes the
 * same host in `to=<CIDR>` (source and destination), with the IPv4 and
 * TCP/UDP checksums updated incrementally (RFC 1624). A UDP checksum of 0
 * (none) stays 0. Other packets pass unchanged. */
#include <sluice_nf.h>

static uint32_t from_net, from_mask, to_net, to_mask;

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)info;
    size_t flen, tlen;
    const char *f = sluice_config_get(config, len, "from", &flen);
    const char *t = sluice_config_get(config, len, "to", &tlen);
    if (!f) return sluice_fail(err, "config: missing from=<IPv4 CIDR>");
    if (!t) return sluice_fail(err, "config: missing to=<IPv4 CIDR>");
    if (!sluice_parse_ipv4_cidr(f, flen, &from_net, &from_mask)) return sluice_fail(err, "config: bad from");
    if (!sluice_parse_ipv4_cidr(t, tlen, &to_net, &to_mask)) return sluice_fail(err, "config: bad to");
    if (from_mask != to_mask) return sluice_fail(err, "config: from and to must have the same prefix length");
    from_net &= from_mask;
    to_net &= to_mask;
    return true;
}

/* Rewrites the address at `at` if it is in `from`, fixing the checksums at
 * ip_sum and (if l4_sum != 0) l4_sum. */
static bool translate(uint8_t *d, size_t len, size_t at, size_t ip_sum, size_t l4_sum) {
    if (at + 4 > len) return false;
    uint32_t old = sluice_be32(d, len, at);
    if ((old & from_mask) != from_net) return false;
    uint32_t new = to_net | (old & ~to_mask);
    uint16_t words[2][2] = {{(uint16_t)(old >> 16), (uint16_t)(new >> 16)}, {(uint16_t)old, (uint16_t)new}};
    for (int w = 0; w < 2; w++) {
        sluice_put_be16(d, len, at + 2 * (size_t)w, words[w][1]);
        sluice_put_be16(d, len, ip_sum, sluice_csum_update16(sluice_be16(d, len, ip_sum), words[w][0], words[w][1]));
        if (l4_sum)
            sluice_put_be16(d, len, l4_sum, sluice_csum_update16(sluice_be16(d, len, l4_sum), words[w][0], words[w][1]));
    }
    return true;
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    (void)err;
    for (uint32_t i = 0; i < sluice_batch_len(batch); i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (!sluice_is_ipv4(&p)) continue;
        size_t l3 = p.l3_offset, l4 = p.l4_offset, l4_sum = 0;
        uint8_t proto = sluice_ip_proto(&p);
        if (p.l4_offset != 0xffff) {
            if (proto == 6 && l4 + 18 <= p.len) l4_sum = l4 + 16;
            if (proto == 17 && l4 + 8 <= p.len && sluice_be16(p.data, p.len, l4 + 6) != 0) l4_sum = l4 + 6;
        }
        uint32_t src = sluice_ipv4_src(&p), dst = sluice_ipv4_dst(&p);
        if ((src & from_mask) != from_net && (dst & from_mask) != from_net) continue;
        uint8_t *d = sluice_rewrite(batch, i);
        if (!d) continue;
        translate(d, p.len, l3 + 12, l3 + 10, l4_sum);
        translate(d, p.len, l3 + 16, l3 + 10, l4_sum);
        if (proto == 17 && l4_sum && sluice_be16(d, p.len, l4_sum) == 0) sluice_put_be16(d, p.len, l4_sum, 0xffff);
    }
    return true;
}
