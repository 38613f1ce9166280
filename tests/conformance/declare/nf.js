// Declares one table of every kind with the SDK's helpers, sized by a
// configuration read with the typed getters, and exercises the IPv6
// accessors and the index of a refused item (see nf.rs for the full
// description): per batch, the largest packet per source in an eventual
// max table whose refusal drops the refused sources, packets per flow, and
// IPv6 source -> destination in a single-writer byte table.
import {
  Bytes,
  Counters,
  DROP,
  NO_FLOW,
  Pool,
  StateError,
  configBool,
  configFloat,
  configInt,
  configString,
  exportNf,
  frame,
  stateless,
} from "@sluice/nf";

const MS = 1_000_000n;

const hex = (b) => Array.from(b, (x) => x.toString(16).padStart(2, "0")).join("");

class Declare {
  init(config) {
    const capacity = configInt(config, "capacity", 65536);
    const idleNs = BigInt(configInt(config, "idle-ms", 0)) * MS;
    this.scale = configFloat(config, "scale", 1.0);
    this.v6Events = configBool(config, "v6-events", false);
    this.tag = configString(config, "tag", "none");
    const poolFirst = configInt(config, "pool-first", 5000);

    this.largest = Counters.eventual("largest", "max", 0n, { capacity, idleTimeoutNs: idleNs });
    this.packets = Counters.perFlow("packets", { idleTimeoutNs: idleNs });
    this.v6 = Bytes.singleWriter("v6", 16, 16, 0n, { capacity: 1000 });
    this.seen = Counters.singleWriter("seen", 0n, { capacity: 1000, idleTimeoutNs: 1000n * MS });
    this.notes = Bytes.perFlow("notes", 8, { capacity: 4096, idleTimeoutNs: 1000n * MS });
    const weights = Counters.readOnly("weights", { capacity: 16 });
    weights.add([1, 2, 3], [10, 20, 30]);
    const names = Bytes.readOnly("names", 0, 16, { capacity: 16 });
    names.putMany(frame([new TextEncoder().encode("tag"), new TextEncoder().encode(this.tag)]));
    this.ports = Pool.declare("ports", poolFirst, 100, 4, 10);
    return stateless();
  }

  process(batch) {
    const sourceOf = [];
    const sources = [];
    const index = new Map();
    const flows = [];
    const flowIndex = new Map();
    const v6 = [];
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      let key;
      if (p.isIpv4()) {
        key = BigInt(p.ipv4Src());
      } else if (p.isIpv6()) {
        const src = p.ipv6Src();
        const dst = p.ipv6Dst();
        v6.push([i, src, dst]);
        key = new DataView(src.buffer, src.byteOffset + 8, 8).getBigUint64(0, false) | (1n << 63n);
      }
      sourceOf.push(key);
      if (key !== undefined) {
        if (index.has(key)) {
          const s = sources[index.get(key)];
          s.largest = Math.max(s.largest, p.wireLen);
        } else {
          index.set(key, sources.length);
          sources.push({ key, first: i, largest: p.wireLen });
        }
      }
      if (p.flow !== NO_FLOW) {
        if (flowIndex.has(p.flow)) flows[flowIndex.get(p.flow)].count++;
        else {
          flowIndex.set(p.flow, flows.length);
          flows.push({ flow: p.flow, count: 1 });
        }
      }
    }
    // (1) The largest packet per source; a full table refuses a source and
    // every one after it.
    if (sources.length) {
      const keys = sources.map((s) => s.key);
      try {
        this.largest.add(keys, sources.map((s) => Math.floor(s.largest * this.scale)));
      } catch (e) {
        if (!(e instanceof StateError) || e.kind !== "full") throw e;
        const refused = new Set(keys.slice(e.item));
        sourceOf.forEach((key, i) => {
          if (key !== undefined && refused.has(key)) batch.setVerdict(i, DROP);
        });
        batch.emit("conformance.full", "warn", sources[e.item].first, [
          ["item", String(e.item)],
          ["sources", String(keys.length)],
        ]);
      }
    }
    // (2) Packets per flow.
    if (flows.length) {
      this.packets.add(
        flows.map((f) => f.flow),
        flows.map((f) => f.count),
      );
    }
    // (3) IPv6 source -> destination.
    if (v6.length) {
      this.v6.putMany(frame(v6.flatMap(([, src, dst]) => [src, dst])));
      if (this.v6Events) {
        const [first, src, dst] = v6[0];
        batch.emit("conformance.v6", "info", first, [
          ["src", hex(src)],
          ["dst", hex(dst)],
          ["tag", this.tag],
        ]);
      }
    }
  }
}

export const nf = exportNf(Declare);
