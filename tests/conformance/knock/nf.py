"""Port knocking on a single-writer byte table `stage` (key-size 4: the
IPv4 source address in network order; max-value-size 1;
sync-interval-ns 10,000,000): a source that sends TCP SYNs to ports
7000, 8000 and 9000, in that order, may then open connections to port
22. A TCP packet is an IPv4 packet whose whole TCP header was
captured; a knock is a TCP SYN without ACK. Each knock, in packet
order, reads its source's stage s with one `get-many` (0 when absent,
else the value's byte), then: to port 22, it is forwarded when s is 3
and dropped otherwise; to port 7000, 8000 or 9000 when that is the
next port of the sequence (s < 3 and the port is the (s+1)-th), one
`put-many` sets the stage to s + 1; to any other port while 0 < s < 3,
one `put-many` removes the key (an empty value: the sequence starts
over). Knocks to other ports than 22 are forwarded; every other packet
is forwarded and touches no table. A stage of 3 stays. Each packet sees
the writes of the packets before it, in the same batch too."""

from sluice_nf import DROP, TCP_ACK, TCP_SYN, Batch, Bytes, export, frame, stateless, unframe

# The ports to knock on, in order; the stage of a source that knocked them
# all; the port they open.
SEQUENCE = (7000, 8000, 9000)
OPENED = 3
GUARDED = 22


class Knock:
    def init(self, config: bytes):
        self.stage = Bytes.single_writer("stage", 4, 1, 10_000_000)
        return stateless()

    def stage_of(self, src: bytes) -> int:
        """The stage of a source (network order): one get-many."""
        values = unframe(self.stage.get_many(frame([src])))
        return values[0][0] if values and values[0] else 0

    def set_stage(self, src: bytes, value: bytes) -> None:
        """Sets the stage of a source (an empty value removes it): one put-many."""
        self.stage.put_many(frame([src, value]))

    def process(self, batch: Batch) -> None:
        for i, p in enumerate(batch.packets()):
            if not p.is_ipv4() or not p.is_tcp():
                continue
            flags = p.tcp_flags()
            if not flags & TCP_SYN or flags & TCP_ACK:
                continue
            src = p.ipv4_src().to_bytes(4, "big")
            s = self.stage_of(src)
            port = p.dst_port()
            if port == GUARDED:
                if s != OPENED:
                    batch.set_verdict(i, DROP)
            elif s < OPENED and SEQUENCE[s] == port:
                self.set_stage(src, bytes([s + 1]))
            elif 0 < s < OPENED:
                self.set_stage(src, b"")


Nf = export(Knock)
