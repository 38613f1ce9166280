"""An IPv4 prefix translator: every address in `from=<CIDR>` becomes the
same host in `to=<CIDR>` (source and destination), with the IPv4 and
TCP/UDP checksums updated incrementally (RFC 1624). A UDP checksum of 0
(none) stays 0. Other packets pass unchanged."""

from sluice_nf import NO_L4, Batch, config_value, csum_update16, export, parse_ipv4_cidr, stateless


def be16(d, at):
    return (d[at] << 8) | d[at + 1]


def put16(d, at, v):
    d[at] = v >> 8
    d[at + 1] = v & 0xFF


class Rewriter:
    def init(self, config: bytes):
        frm, to = config_value(config, "from"), config_value(config, "to")
        if frm is None:
            raise ValueError("config: missing from=<IPv4 CIDR>")
        if to is None:
            raise ValueError("config: missing to=<IPv4 CIDR>")
        self.from_net, self.from_mask = parse_ipv4_cidr(frm)
        self.to_net, self.to_mask = parse_ipv4_cidr(to)
        if self.from_mask != self.to_mask:
            raise ValueError("config: from and to must have the same prefix length")
        return stateless()

    def translate(self, d, at, ip_sum, l4_sum):
        old = int.from_bytes(d[at:at + 4], "big")
        if old & self.from_mask != self.from_net:
            return
        new = self.to_net | (old & ~self.to_mask & 0xFFFFFFFF)
        for w, (o, n) in enumerate(((old >> 16, new >> 16), (old & 0xFFFF, new & 0xFFFF))):
            put16(d, at + 2 * w, n)
            put16(d, ip_sum, csum_update16(be16(d, ip_sum), o, n))
            if l4_sum:
                put16(d, l4_sum, csum_update16(be16(d, l4_sum), o, n))

    def process(self, batch: Batch) -> None:
        for i, p in enumerate(batch.packets()):
            if not p.is_ipv4():
                continue
            src, dst = p.ipv4_src(), p.ipv4_dst()
            if src & self.from_mask != self.from_net and dst & self.from_mask != self.from_net:
                continue
            l3, l4, n, proto = p.l3_offset, p.l4_offset, len(p.data), p.ip_proto()
            l4_sum = 0
            if l4 != NO_L4:
                if proto == 6 and l4 + 18 <= n:
                    l4_sum = l4 + 16
                if proto == 17 and l4 + 8 <= n and be16(p.data, l4 + 6) != 0:
                    l4_sum = l4 + 6
            d = bytearray(p.data)
            self.translate(d, l3 + 12, l3 + 10, l4_sum)
            self.translate(d, l3 + 16, l3 + 10, l4_sum)
            if proto == 17 and l4_sum and be16(d, l4_sum) == 0:
                put16(d, l4_sum, 0xFFFF)
            batch.rewrite(i, d)


Nf = export(Rewriter)
