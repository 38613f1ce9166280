"""A stateful firewall that offloads established flows: connections from
inside (`inside=<IPv4 CIDR>`) may go out and their replies come back;
anything else is dropped; a TCP RST forgets the flow's one byte of state.
With `dscp=<0..63>` every forwarded packet gets that DSCP (the IPv4 header
checksum updated incrementally). Forwarded packets and their bytes on the
wire are counted in the eventual counter table `forwarded` (key 0:
packets, key 1: bytes), one counter-add per batch.

With `offload=true`, a forwarded TCP or UDP packet of a flow that had
state before it, carrying none of SYN, FIN, RST, has its flow offloaded in
its direction (the same DSCP change, counts returned), and the packets and
bytes of every ended entry are added to `forwarded`: the output and the
table are the same with offload and without."""

from sluice_nf import (DROP, NO_FLOW, TCP_FIN, TCP_RST, TCP_SYN, Batch, Counters, config_bool, config_int,
                       config_value, csum_update16, export, parse_ipv4_cidr, set_dscp, with_flow_state)


class Firewall:
    def init(self, config: bytes):
        inside = config_value(config, "inside")
        if inside is None:
            raise ValueError("config: missing inside=<IPv4 CIDR>")
        self.net, self.mask = parse_ipv4_cidr(inside)
        self.dscp = config_int(config, "dscp", -1)
        if not -1 <= self.dscp <= 63:
            raise ValueError(f"config: dscp = {self.dscp}: not 0 to 63")
        self.offload = config_bool(config, "offload", False)
        self.rewrites = [set_dscp(self.dscp)] if self.dscp >= 0 else []
        self.forwarded = Counters.sum("forwarded")
        return with_flow_state()

    def process(self, batch: Batch) -> None:
        packets = nbytes = 0
        for r in batch.offload_returns():
            packets += r.packets
            nbytes += r.bytes
        for i, p in enumerate(batch.packets()):
            flow = p.flow
            if flow == NO_FLOW:
                batch.set_verdict(i, DROP)
                continue
            flags = p.tcp_flags()
            known = batch.flow_state(flow) is not None
            if known:
                if flags & TCP_RST:
                    batch.remove_flow_state(flow)
            elif p.is_ipv4() and (p.ipv4_src() & self.mask) == self.net:
                batch.set_flow_state(flow, b"\x01")
                if flags & TCP_RST:
                    batch.remove_flow_state(flow)
            else:
                batch.set_verdict(i, DROP)
                continue
            packets += 1
            nbytes += p.wire_len
            if self.dscp >= 0 and p.is_ipv4():
                d = bytearray(p.data)
                l3 = p.l3_offset
                old = (d[l3] << 8) | d[l3 + 1]
                d[l3 + 1] = (self.dscp << 2) | (d[l3 + 1] & 3)
                s = csum_update16((d[l3 + 10] << 8) | d[l3 + 11], old, (d[l3] << 8) | d[l3 + 1])
                d[l3 + 10], d[l3 + 11] = s >> 8, s & 0xFF
                batch.rewrite(i, d)
            if self.offload and known and (p.is_udp() or (p.is_tcp() and not flags & (TCP_SYN | TCP_FIN | TCP_RST))):
                batch.offload(i, rewrites=self.rewrites)
        if packets:
            self.forwarded.add([0, 1], [packets, nbytes])


Nf = export(Firewall)
