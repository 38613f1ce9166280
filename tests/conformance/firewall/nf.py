"""A stateful firewall: connections from inside (`inside=<IPv4 CIDR>` in
the config) may go out, and their replies come back; ARP passes (the
hosts on a link must find each other's addresses to talk at all);
anything else is dropped. Each allowed flow keeps one byte of per-flow
state; a TCP RST forgets it."""

from sluice_nf import DROP, NO_FLOW, TCP_RST, Batch, config_value, export, parse_ipv4_cidr, with_flow_state


class Firewall:
    def init(self, config: bytes):
        inside = config_value(config, "inside")
        if inside is None:
            raise ValueError("config: missing inside=<IPv4 CIDR>")
        self.net, self.mask = parse_ipv4_cidr(inside)
        return with_flow_state()

    def process(self, batch: Batch) -> None:
        for i, p in enumerate(batch.packets()):
            from_inside = p.is_ipv4() and (p.ipv4_src() & self.mask) == self.net
            rst = p.tcp_flags() & TCP_RST
            if p.flow == NO_FLOW:
                # Not IP: ARP (EtherType 0x0806) passes, the rest drops.
                if bytes(p.data[12:14]) != b"\x08\x06":
                    batch.set_verdict(i, DROP)
            elif batch.flow_state(p.flow) is not None:
                if rst:
                    batch.remove_flow_state(p.flow)
            elif from_inside:
                batch.set_flow_state(p.flow, b"\x01")
                if rst:
                    batch.remove_flow_state(p.flow)
            else:
                batch.set_verdict(i, DROP)


Nf = export(Firewall)
