// Forwards every packet and counts packets and bytes on the wire in the
// host table `totals` (key 0: packets, key 1: bytes), one counter-add per
// batch.
import { Counters, exportNf, stateless } from "@sluice/nf";

class Counter {
  init(config) {
    this.totals = Counters.sum("totals");
    return stateless();
  }

  process(batch) {
    let bytes = 0;
    for (const p of batch.packets()) bytes += p.wireLen;
    this.totals.add([0, 1], [batch.length, bytes]);
  }
}

export const nf = exportNf(Counter);
