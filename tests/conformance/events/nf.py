"""Reports every TCP connection attempt: for each IPv4 TCP packet with SYN
set and ACK clear, a `conformance.syn` event (level info, the packet's
index, fields `src` and `dst` as `a.b.c.d:port`). A batch's events go to
the host in one call. Every packet is forwarded."""

from sluice_nf import TCP_ACK, TCP_SYN, Batch, Level, export, stateless


def endpoint(a: int, port: int) -> str:
    return f"{a >> 24}.{(a >> 16) & 0xFF}.{(a >> 8) & 0xFF}.{a & 0xFF}:{port}"


class Syns:
    def init(self, config: bytes):
        return stateless()

    def process(self, batch: Batch) -> None:
        for i, p in enumerate(batch.packets()):
            if not (p.is_ipv4() and p.is_tcp()):
                continue
            flags = p.tcp_flags()
            if flags & TCP_SYN and not flags & TCP_ACK:
                batch.emit("conformance.syn", Level.INFO, i, [
                    ("src", endpoint(p.ipv4_src(), p.src_port())),
                    ("dst", endpoint(p.ipv4_dst(), p.dst_port())),
                ])


Nf = export(Syns)
