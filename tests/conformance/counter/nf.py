"""Forwards every packet and counts packets and bytes on the wire in the
host table `totals` (key 0: packets, key 1: bytes), one counter-add per
batch."""

from sluice_nf import Batch, Counters, export, stateless


class Counter:
    def init(self, config: bytes):
        self.totals = Counters.sum("totals")
        return stateless()

    def process(self, batch: Batch) -> None:
        wire_bytes = sum(p.wire_len for p in batch.packets())
        self.totals.add([0, 1], [len(batch), wire_bytes])


Nf = export(Counter)
