// Gives every flow an id from a pool and remembers it per flow (see nf.rs
// for the full description): new flows acquire ids bound to their IPv4
// source, ids are stored per flow, read back with lookup and reported as
// `conformance.flow` events; FIN/RST gives the id back.
import { Bytes, NO_FLOW, Pool, TCP_FIN, TCP_RST, exportNf, frame, stateless, unframe } from "@sluice/nf";

const le32 = (v) => Uint8Array.of(v & 0xff, (v >>> 8) & 0xff, (v >>> 16) & 0xff, v >>> 24);
const le64 = (v) => {
  const b = new Uint8Array(8);
  new DataView(b.buffer).setBigUint64(0, BigInt(v), true);
  return b;
};

class Tables {
  init(config) {
    this.ids = Bytes.perFlow("ids", 8);
    this.pool = Pool.declare("pool", 100, 1000, 4);
    return stateless();
  }

  process(batch) {
    const flows = [];
    const index = new Map();
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      if (p.flow === NO_FLOW) continue;
      const ends = (p.tcpFlags() & (TCP_FIN | TCP_RST)) !== 0;
      if (index.has(p.flow)) {
        flows[index.get(p.flow)].ends ||= ends;
      } else {
        const a = p.ipv4Src();
        index.set(p.flow, flows.length);
        flows.push({ flow: p.flow, first: i, src: Uint8Array.of(a >>> 24, (a >>> 16) & 0xff, (a >>> 8) & 0xff, a & 0xff), ends });
      }
    }
    if (!flows.length) return;
    const known = unframe(this.ids.getMany(frame(flows.map((f) => le32(f.flow)))));
    const idOf = known.map((v) => (v.length === 8 ? new DataView(v.buffer, v.byteOffset, 8).getBigUint64(0, true) : undefined));
    const fresh = [];
    known.forEach((v, k) => {
      if (!v.length) fresh.push(k);
    });
    if (fresh.length) {
      const ids = this.pool.acquire(frame(fresh.map((k) => flows[k].src)));
      const entries = [];
      fresh.forEach((k, j) => {
        if (j >= ids.length) return;
        entries.push(le32(flows[k].flow), le64(ids[j]));
        idOf[k] = ids[j];
      });
      this.ids.putMany(frame(entries));
      const bound = unframe(this.pool.lookup(ids));
      fresh.forEach((k, j) => {
        if (j >= ids.length) return;
        const host = bound[j].length === 4 ? Array.from(bound[j]).join(".") : "none";
        batch.emit("conformance.flow", "info", flows[k].first, [
          ["id", ids[j].toString()],
          ["host", host],
        ]);
      });
    }
    const done = [];
    const removals = [];
    flows.forEach((f, k) => {
      if (f.ends && idOf[k] !== undefined) {
        done.push(idOf[k]);
        removals.push(le32(f.flow), new Uint8Array(0));
      }
    });
    if (done.length) {
      this.pool.release(done);
      this.ids.putMany(frame(removals));
    }
  }
}

export const nf = exportNf(Tables);
