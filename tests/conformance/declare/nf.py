"""Declares one table of every kind with the SDK's helpers, sized by a
configuration read with the typed getters, and exercises the IPv6
accessors and the index of a refused item (see nf.rs for the full
description): per batch, the largest packet per source in an eventual max
table whose refusal drops the refused sources, packets per flow, and IPv6
source -> destination in a single-writer byte table."""

import math

from sluice_nf import (DROP, NO_FLOW, Batch, Bytes, Counters, Level, Merge, Pool, StateError, config_bool,
                       config_float, config_int, config_str, export, frame, stateless)

MS = 1_000_000


class Declare:
    def init(self, config: bytes):
        capacity = config_int(config, "capacity", 65536)
        idle_ns = config_int(config, "idle-ms", 0) * MS
        self.scale = config_float(config, "scale", 1.0)
        self.v6_events = config_bool(config, "v6-events", False)
        self.tag = config_str(config, "tag", "none")
        pool_first = config_int(config, "pool-first", 5000)

        self.largest = Counters.eventual("largest", Merge.MAX, 0, capacity=capacity, idle_timeout_ns=idle_ns)
        self.packets = Counters.per_flow("packets", idle_timeout_ns=idle_ns)
        self.v6 = Bytes.single_writer("v6", 16, 16, 0, capacity=1000)
        self.seen = Counters.single_writer("seen", 0, capacity=1000, idle_timeout_ns=1000 * MS)
        self.notes = Bytes.per_flow("notes", 8, 1000 * MS, capacity=4096)
        weights = Counters.read_only("weights", capacity=16)
        weights.add([1, 2, 3], [10, 20, 30])
        names = Bytes.read_only("names", 0, 16, capacity=16)
        names.put_many(frame([b"tag", self.tag.encode()]))
        self.ports = Pool.declare("ports", pool_first, 100, 4, chunk=10)
        return stateless()

    def process(self, batch: Batch) -> None:
        source_of, sources, index, flows, flow_index, v6 = [], [], {}, [], {}, []
        for i, p in enumerate(batch.packets()):
            key = None
            if p.is_ipv4():
                key = p.ipv4_src()
            elif p.is_ipv6():
                src, dst = p.ipv6_src(), p.ipv6_dst()
                v6.append((i, src, dst))
                key = int.from_bytes(src[8:], "big") | 1 << 63
            source_of.append(key)
            if key is not None:
                if key in index:
                    s = sources[index[key]]
                    s[2] = max(s[2], p.wire_len)
                else:
                    index[key] = len(sources)
                    sources.append([key, i, p.wire_len])
            if p.flow != NO_FLOW:
                if p.flow in flow_index:
                    flows[flow_index[p.flow]][1] += 1
                else:
                    flow_index[p.flow] = len(flows)
                    flows.append([p.flow, 1])
        # (1) The largest packet per source; a full table refuses a source
        # and every one after it.
        if sources:
            keys = [s[0] for s in sources]
            try:
                self.largest.add(keys, [math.floor(s[2] * self.scale) for s in sources])
            except StateError as e:
                if e.kind != "full":
                    raise
                refused = set(keys[e.item:])
                for i, key in enumerate(source_of):
                    if key in refused:
                        batch.set_verdict(i, DROP)
                batch.emit("conformance.full", Level.WARN, sources[e.item][1],
                           [("item", str(e.item)), ("sources", str(len(keys)))])
        # (2) Packets per flow.
        if flows:
            self.packets.add([f[0] for f in flows], [f[1] for f in flows])
        # (3) IPv6 source -> destination.
        if v6:
            entries = []
            for _, src, dst in v6:
                entries += [src, dst]
            self.v6.put_many(frame(entries))
            if self.v6_events:
                first, src, dst = v6[0]
                batch.emit("conformance.v6", Level.INFO, first, [("src", src.hex()), ("dst", dst.hex()), ("tag", self.tag)])


Nf = export(Declare)
