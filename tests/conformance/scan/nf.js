// Counts IPv4 TCP packets per destination port and lists the table with
// scan and top-k (see nf.rs for the full description): per batch, one
// counter-add on the eventual table `ports`; on the batch's first SYN (ACK
// clear), a `conformance.scan` event with the top 3 ports, what a full
// scan of `ports` in pages of 16 walks, and the keys of the read-only byte
// table `names` scanned in pages of 2.
import { Bytes, Counters, TCP_ACK, TCP_SYN, exportNf, frame, stateless } from "@sluice/nf";

const text = (s) => new TextEncoder().encode(s);

class Scan {
  init(config) {
    this.ports = Counters.eventual("ports", "sum", 0n);
    this.names = Bytes.readOnly("names", 0, 8);
    const entries = [];
    for (const [name, port] of [["http", "80"], ["https", "443"], ["dns", "53"], ["ssh", "22"], ["ntp", "123"]]) {
      entries.push(text(name), text(port));
    }
    this.names.putMany(frame(entries));
    return stateless();
  }

  process(batch) {
    const counts = new Map();
    let trigger;
    for (let at = 0; at < batch.length; at++) {
      const p = batch.packet(at);
      if (!p.isIpv4() || !p.isTcp()) continue;
      const port = p.dstPort();
      counts.set(port, (counts.get(port) ?? 0) + 1);
      const flags = p.tcpFlags();
      if (trigger === undefined && flags & TCP_SYN && !(flags & TCP_ACK)) trigger = at;
    }
    if (counts.size) this.ports.add([...counts.keys()], [...counts.values()]);
    if (trigger === undefined) return;
    const top = this.ports.topK(3).map(([port, n]) => `${port}=${n}`).join(",");
    let entries = 0, pages = 0, total = 0n, ascending = true, last;
    let cursor = new Uint8Array(0);
    for (;;) {
      const page = this.ports.scan(cursor, 16);
      pages++;
      for (const [key, value] of page.entries) {
        entries++;
        total += value;
        ascending &&= last === undefined || key > last;
        last = key;
      }
      if (page.cursor.length === 0) break;
      cursor = page.cursor;
    }
    const names = [];
    for (const [key] of this.names.entries(2)) names.push(String.fromCharCode(...key));
    batch.emit("conformance.scan", "info", trigger, [
      ["top", top],
      ["entries", String(entries)],
      ["pages", String(pages)],
      ["total", String(total)],
      ["ascending", ascending ? "yes" : "no"],
      ["names", names.join(",")],
    ]);
  }
}

export const nf = exportNf(Scan);
