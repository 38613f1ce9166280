// A stateful firewall that offloads established flows: connections from
// inside (`inside=<IPv4 CIDR>`) may go out and their replies come back;
// anything else is dropped; a TCP RST forgets the flow's one byte of
// state. With `dscp=<0..63>` every forwarded packet gets that DSCP (the
// IPv4 header checksum updated incrementally). Forwarded packets and their
// bytes on the wire are counted in the eventual counter table `forwarded`
// (key 0: packets, key 1: bytes), one counter-add per batch.
//
// With `offload=true`, a forwarded TCP or UDP packet of a flow that had
// state before it, carrying none of SYN, FIN, RST, has its flow offloaded
// in its direction (the same DSCP change, counts returned), and the
// packets and bytes of every ended entry are added to `forwarded`: the
// output and the table are the same with offload and without. With
// `offload-after=<n>` a direction is offloaded at its nth such packet
// (default 1: at its first), counted with `Admission`.
// A FIN marks the flow closing (state byte 2): nothing of it is
// offloaded after that; a SYN on it opens it again.
import {
  Admission,
  Counters,
  DROP,
  NO_FLOW,
  TCP_FIN,
  TCP_RST,
  TCP_SYN,
  configBool,
  configInt,
  configValue,
  csumUpdate16,
  exportNf,
  parseIpv4Cidr,
  setDscp,
  withFlowState,
} from "@sluice/nf";

// A flow's state: allowed, and allowed with a FIN seen (no offload from
// then on: what is left of the connection is a few packets).
const ALLOWED = Uint8Array.of(1);
const CLOSING = Uint8Array.of(2);

class Firewall {
  init(config) {
    const inside = configValue(config, "inside");
    if (inside === undefined) throw new Error("config: missing inside=<IPv4 CIDR>");
    [this.net, this.mask] = parseIpv4Cidr(inside);
    this.dscp = Number(configInt(config, "dscp", -1));
    if (this.dscp < -1 || this.dscp > 63) throw new Error(`config: dscp = ${this.dscp}: not 0 to 63`);
    this.offload = configBool(config, "offload", false);
    const after = Number(configInt(config, "offload-after", 1));
    if (after < 0 || after > 1000000) throw new Error(`config: offload-after = ${after}: not 0 to 1000000`);
    this.gate = new Admission(after);
    this.rewrites = this.dscp >= 0 ? [setDscp(this.dscp)] : [];
    this.forwarded = Counters.sum("forwarded");
    return withFlowState();
  }

  process(batch) {
    let packets = 0, bytes = 0;
    for (const r of batch.offloadReturns()) {
      packets += Number(r.packets);
      bytes += Number(r.bytes);
    }
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      const flow = p.flow;
      if (flow === NO_FLOW) {
        batch.setVerdict(i, DROP);
        continue;
      }
      const flags = p.tcpFlags();
      const state = batch.flowState(flow);
      const known = state !== undefined;
      const closing = known && state[0] === 2;
      if (known) {
        if (flags & TCP_RST) batch.removeFlowState(flow);
        if (flags & TCP_SYN) {
          // A new connection on the flow's 5-tuple.
          if (closing) batch.setFlowState(flow, ALLOWED);
          this.gate.forget(p);
        } else if (flags & TCP_FIN && !closing) {
          batch.setFlowState(flow, CLOSING);
        }
      } else if (p.isIpv4() && ((p.ipv4Src() & this.mask) >>> 0) === this.net) {
        batch.setFlowState(flow, ALLOWED);
        this.gate.forget(p);
        if (flags & TCP_RST) batch.removeFlowState(flow);
      } else {
        batch.setVerdict(i, DROP);
        continue;
      }
      packets += 1;
      bytes += p.wireLen;
      if (this.dscp >= 0 && p.isIpv4()) {
        const d = new Uint8Array(p.data), l3 = p.l3Offset;
        const old = (d[l3] << 8) | d[l3 + 1];
        d[l3 + 1] = (this.dscp << 2) | (d[l3 + 1] & 3);
        const s = csumUpdate16((d[l3 + 10] << 8) | d[l3 + 11], old, (d[l3] << 8) | d[l3 + 1]);
        d[l3 + 10] = s >>> 8;
        d[l3 + 11] = s & 0xff;
        batch.rewrite(i, d);
      }
      const eligible = p.isUdp() || (p.isTcp() && !(flags & (TCP_SYN | TCP_FIN | TCP_RST)));
      if (this.offload && known && !closing && eligible && this.gate.admit(p)) {
        batch.offload(i, { rewrites: this.rewrites });
      }
    }
    if (packets) this.forwarded.add([0, 1], [packets, bytes]);
  }
}

export const nf = exportNf(Firewall);
