/* Reports every TCP connection attempt: for each IPv4 TCP packet with SYN
 * set and ACK clear, a `conformance.syn` event (level info, the packet's
 * index, fields `src` and `dst` as `a.b.c.d:port`). A batch's events go to
 * the host in one call. Every packet is forwarded. */
#include <sluice_nf.h>
#include <stdio.h>

bool nf_init(const uint8_t *config, size_t len, sluice_info_t *info, sluice_error_t *err) {
    (void)config, (void)len, (void)info, (void)err;
    return true;
}

static void endpoint(char *out, size_t n, uint32_t a, uint16_t port) {
    snprintf(out, n, "%u.%u.%u.%u:%u", a >> 24, (a >> 16) & 0xff, (a >> 8) & 0xff, a & 0xff, port);
}

bool nf_process(sluice_batch_t *batch, sluice_error_t *err) {
    for (uint32_t i = 0; i < sluice_batch_len(batch); i++) {
        sluice_packet_t p = sluice_batch_packet(batch, i);
        if (!sluice_is_ipv4(&p) || !sluice_is_tcp(&p)) continue;
        uint8_t flags = sluice_tcp_flags(&p);
        if (!(flags & SLUICE_TCP_SYN) || (flags & SLUICE_TCP_ACK)) continue;
        char src[24], dst[24];
        endpoint(src, sizeof src, sluice_ipv4_src(&p), sluice_src_port(&p));
        endpoint(dst, sizeof dst, sluice_ipv4_dst(&p), sluice_dst_port(&p));
        const char *fields[] = {"src", src, "dst", dst};
        if (!sluice_event(batch, "conformance.syn", SLUICE_INFO, i, fields, 2)) return sluice_fail(err, "out of memory");
    }
    return true;
}
