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
table are the same with offload and without. With `offload-after=<n>` a
direction is offloaded at its nth such packet (default 1: at its first),
counted with `Admission`.
A FIN marks the flow closing (state byte 2): nothing of it is
offloaded after that; a SYN on it opens it again."""

from sluice_nf import (DROP, NO_FLOW, TCP_FIN, TCP_RST, TCP_SYN, Admission, Batch, Counters, config_bool,
                       config_int, config_value, csum_update16, export, parse_ipv4_cidr, set_dscp, with_flow_state)


# A flow's state: allowed, and allowed with a FIN seen (no offload from then
# on: what is left of the connection is a few packets).
OPEN, CLOSING = b"\x01", b"\x02"


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
        after = config_int(config, "offload-after", 1)
        if not 0 <= after <= 1_000_000:
            raise ValueError(f"config: offload-after = {after}: not 0 to 1000000")
        self.gate = Admission(after)
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
            state = batch.flow_state(flow)
            known = state is not None
            closing = known and state[:1] == CLOSING
            if known:
                if flags & TCP_RST:
                    batch.remove_flow_state(flow)
                if flags & TCP_SYN:
                    # A new connection on the flow's 5-tuple.
                    if closing:
                        batch.set_flow_state(flow, OPEN)
                    self.gate.forget(p)
                elif flags & TCP_FIN and not closing:
                    batch.set_flow_state(flow, CLOSING)
            elif p.is_ipv4() and (p.ipv4_src() & self.mask) == self.net:
                batch.set_flow_state(flow, OPEN)
                self.gate.forget(p)
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
            if (self.offload and known and not closing and (p.is_udp() or (p.is_tcp() and not flags & (TCP_SYN | TCP_FIN | TCP_RST)))
                    and self.gate.admit(p)):
                batch.offload(i, rewrites=self.rewrites)
        if packets:
            self.forwarded.add([0, 1], [packets, nbytes])


Nf = export(Firewall)
