"""Remembers each flow for 2 ms of packet time and reports when the host
forgets it (see nf.rs for the full description): per-flow packet counts in
a per-flow byte table with notify-expired; `expired` emits one
`conformance.expired` event per entry."""

from sluice_nf import NO_FLOW, Batch, Bytes, Level, emit, export, frame, stateless, unframe


class Expiry:
    def init(self, config: bytes):
        self.recent = Bytes.per_flow("recent", 8, idle_timeout_ns=2_000_000, notify_expired=True)
        return stateless()

    def process(self, batch: Batch) -> None:
        counts = {}
        for p in batch.packets():
            if p.flow != NO_FLOW:
                counts[p.flow] = counts.get(p.flow, 0) + 1
        if counts:
            items = []
            for flow, n in counts.items():
                items += [flow.to_bytes(4, "little"), n.to_bytes(8, "little")]
            self.recent.put_many(frame(items))

    def expired(self, table: int, entries: bytes) -> None:
        items = unframe(entries)
        events = []
        for key, value in zip(items[0::2], items[1::2]):
            packets = int.from_bytes(value, "little") if len(value) == 8 else 0
            events.append(("conformance.expired", Level.INFO, [("key", key.hex()), ("packets", str(packets))]))
        emit(events)


Nf = export(Expiry)
