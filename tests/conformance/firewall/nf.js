// A stateful firewall: connections from inside (`inside=<IPv4 CIDR>` in
// the config) may go out, and their replies come back; ARP passes (the
// hosts on a link must find each other's addresses to talk at all);
// anything else is dropped. Each allowed flow keeps one byte of per-flow
// state; a TCP RST forgets it.
import { DROP, NO_FLOW, TCP_RST, configValue, exportNf, parseIpv4Cidr, withFlowState } from "@sluice/nf";

const ALLOWED = Uint8Array.of(1);

class Firewall {
  init(config) {
    const inside = configValue(config, "inside");
    if (inside === undefined) throw new Error("config: missing inside=<IPv4 CIDR>");
    [this.net, this.mask] = parseIpv4Cidr(inside);
    return withFlowState();
  }

  process(batch) {
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      const fromInside = p.isIpv4() && ((p.ipv4Src() & this.mask) >>> 0) === this.net;
      const rst = p.tcpFlags() & TCP_RST;
      if (p.flow === NO_FLOW) {
        // Not IP: ARP (EtherType 0x0806) passes, the rest drops.
        const d = p.data;
        if (!(d.length >= 14 && d[12] === 0x08 && d[13] === 0x06)) batch.setVerdict(i, DROP);
      } else if (batch.flowState(p.flow) !== undefined) {
        if (rst) batch.removeFlowState(p.flow);
      } else if (fromInside) {
        batch.setFlowState(p.flow, ALLOWED);
        if (rst) batch.removeFlowState(p.flow);
      } else {
        batch.setVerdict(i, DROP);
      }
    }
  }
}

export const nf = exportNf(Firewall);
