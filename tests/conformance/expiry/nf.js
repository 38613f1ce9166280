// Remembers each flow for 2 ms of packet time and reports when the host
// forgets it (see nf.rs for the full description): per-flow packet counts
// in a per-flow byte table with notify-expired; `expired` emits one
// `conformance.expired` event per entry.
import { Bytes, NO_FLOW, emit, exportNf, frame, stateless, unframe } from "@sluice/nf";

class Expiry {
  init(config) {
    this.recent = Bytes.perFlow("recent", 8, { idleTimeoutNs: 2000000n, notifyExpired: true });
    return stateless();
  }

  process(batch) {
    const counts = new Map();
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      if (p.flow !== NO_FLOW) counts.set(p.flow, (counts.get(p.flow) ?? 0) + 1);
    }
    if (!counts.size) return;
    const items = [];
    for (const [flow, n] of counts) {
      const v = new Uint8Array(8);
      new DataView(v.buffer).setBigUint64(0, BigInt(n), true);
      items.push(Uint8Array.of(flow & 0xff, (flow >>> 8) & 0xff, (flow >>> 16) & 0xff, flow >>> 24), v);
    }
    this.recent.putMany(frame(items));
  }

  expired(table, entries) {
    const items = unframe(entries);
    const events = [];
    for (let i = 0; i + 1 < items.length; i += 2) {
      const key = Array.from(items[i], (b) => b.toString(16).padStart(2, "0")).join("");
      const v = items[i + 1];
      const packets = v.length === 8 ? new DataView(v.buffer, v.byteOffset, 8).getBigUint64(0, true) : 0n;
      events.push({ kind: "conformance.expired", level: "info", fields: [["key", key], ["packets", packets.toString()]] });
    }
    emit(events);
  }
}

export const nf = exportNf(Expiry);
