"""Gives every flow an id from a pool and remembers it per flow (see
nf.rs for the full description): new flows acquire ids bound to their
IPv4 source, ids are stored per flow, read back with lookup and reported
as `conformance.flow` events; FIN/RST gives the id back."""

from sluice_nf import NO_FLOW, TCP_FIN, TCP_RST, Batch, Bytes, Level, Pool, export, frame, stateless, unframe


class Tables:
    def init(self, config: bytes):
        self.ids = Bytes.per_flow("ids", 8)
        self.pool = Pool.declare("pool", 100, 1000, 4)
        return stateless()

    def process(self, batch: Batch) -> None:
        flows, index = [], {}
        for i, p in enumerate(batch.packets()):
            if p.flow == NO_FLOW:
                continue
            ends = bool(p.tcp_flags() & (TCP_FIN | TCP_RST))
            if p.flow in index:
                flows[index[p.flow]][3] |= ends
            else:
                src = p.ipv4_src().to_bytes(4, "big")
                index[p.flow] = len(flows)
                flows.append([p.flow, i, src, ends])
        if not flows:
            return
        known = unframe(self.ids.get_many(frame([f[0].to_bytes(4, "little") for f in flows])))
        id_of = [int.from_bytes(v, "little") if len(v) == 8 else None for v in known]
        fresh = [k for k, v in enumerate(known) if not v]
        if fresh:
            ids = self.pool.acquire(frame([flows[k][2] for k in fresh]))
            entries = []
            for k, rid in zip(fresh, ids):
                entries += [flows[k][0].to_bytes(4, "little"), rid.to_bytes(8, "little")]
                id_of[k] = rid
            self.ids.put_many(frame(entries))
            bound = unframe(self.pool.lookup(ids))
            for k, rid, host in zip(fresh, ids, bound):
                name = ".".join(str(b) for b in host) if len(host) == 4 else "none"
                batch.emit("conformance.flow", Level.INFO, flows[k][1], [("id", str(rid)), ("host", name)])
        done, removals = [], []
        for k, f in enumerate(flows):
            if f[3] and id_of[k] is not None:
                done.append(id_of[k])
                removals += [f[0].to_bytes(4, "little"), b""]
        if done:
            self.pool.release(done)
            self.ids.put_many(frame(removals))


Nf = export(Tables)
