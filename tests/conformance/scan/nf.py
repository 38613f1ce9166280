"""Counts IPv4 TCP packets per destination port and lists the table with
scan and top-k (see nf.rs for the full description): per batch, one
counter-add on the eventual table `ports`; on the batch's first SYN (ACK
clear), a `conformance.scan` event with the top 3 ports, what a full scan
of `ports` in pages of 16 walks, and the keys of the read-only byte table
`names` scanned in pages of 2."""

from sluice_nf import TCP_ACK, TCP_SYN, Batch, Bytes, Counters, Level, Merge, export, frame, stateless


class Scan:
    def init(self, config: bytes):
        self.ports = Counters.eventual("ports", Merge.SUM, 0)
        self.names = Bytes.read_only("names", 0, 8)
        self.names.put_many(frame([b"http", b"80", b"https", b"443", b"dns", b"53", b"ssh", b"22", b"ntp", b"123"]))
        return stateless()

    def process(self, batch: Batch) -> None:
        counts = {}
        trigger = None
        for i, p in enumerate(batch.packets()):
            if not (p.is_ipv4() and p.is_tcp()):
                continue
            port = p.dst_port()
            counts[port] = counts.get(port, 0) + 1
            flags = p.tcp_flags()
            if trigger is None and flags & TCP_SYN and not flags & TCP_ACK:
                trigger = i
        if counts:
            self.ports.add(list(counts.keys()), list(counts.values()))
        if trigger is None:
            return
        top = ",".join(f"{port}={n}" for port, n in self.ports.top_k(3))
        entries = pages = total = 0
        ascending, last, cursor = True, None, b""
        while True:
            page = self.ports.scan(cursor, 16)
            pages += 1
            for key, value in page.entries:
                entries += 1
                total += value
                ascending = ascending and (last is None or key > last)
                last = key
            if not page.cursor:
                break
            cursor = page.cursor
        names = [key.decode() for key, _ in self.names.items(2)]
        batch.emit("conformance.scan", Level.INFO, trigger, [
            ("top", top), ("entries", str(entries)), ("pages", str(pages)), ("total", str(total)),
            ("ascending", "yes" if ascending else "no"), ("names", ",".join(names)),
        ])


Nf = export(Scan)
