// Reports every TCP connection attempt: for each IPv4 TCP packet with SYN
// set and ACK clear, a `conformance.syn` event (level info, the packet's
// index, fields `src` and `dst` as `a.b.c.d:port`). A batch's events go to
// the host in one call. Every packet is forwarded.
import { TCP_ACK, TCP_SYN, exportNf, stateless } from "@sluice/nf";

const endpoint = (a, port) => `${a >>> 24}.${(a >>> 16) & 0xff}.${(a >>> 8) & 0xff}.${a & 0xff}:${port}`;

class Syns {
  init(config) {
    return stateless();
  }

  process(batch) {
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      if (!p.isIpv4() || !p.isTcp()) continue;
      const flags = p.tcpFlags();
      if (flags & TCP_SYN && !(flags & TCP_ACK)) {
        batch.emit("conformance.syn", "info", i, [
          ["src", endpoint(p.ipv4Src(), p.srcPort())],
          ["dst", endpoint(p.ipv4Dst(), p.dstPort())],
        ]);
      }
    }
  }
}

export const nf = exportNf(Syns);
