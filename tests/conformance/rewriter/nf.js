// An IPv4 prefix translator: every address in `from=<CIDR>` becomes the
// same host in `to=<CIDR>` (source and destination), with the IPv4 and
// TCP/UDP checksums updated incrementally (RFC 1624). A UDP checksum of 0
// (none) stays 0. Other packets pass unchanged.
import { NO_L4, configValue, csumUpdate16, exportNf, parseIpv4Cidr, stateless } from "@sluice/nf";

const be16 = (d, at) => (d[at] << 8) | d[at + 1];
const put16 = (d, at, v) => {
  d[at] = v >>> 8;
  d[at + 1] = v & 0xff;
};

class Rewriter {
  init(config) {
    const from = configValue(config, "from");
    const to = configValue(config, "to");
    if (from === undefined) throw new Error("config: missing from=<IPv4 CIDR>");
    if (to === undefined) throw new Error("config: missing to=<IPv4 CIDR>");
    [this.fromNet, this.fromMask] = parseIpv4Cidr(from);
    [this.toNet, this.toMask] = parseIpv4Cidr(to);
    if (this.fromMask !== this.toMask) throw new Error("config: from and to must have the same prefix length");
    return stateless();
  }

  inFrom(a) {
    return ((a & this.fromMask) >>> 0) === this.fromNet;
  }

  translate(d, at, ipSum, l4Sum) {
    const old = ((d[at] << 24) | (d[at + 1] << 16) | (d[at + 2] << 8) | d[at + 3]) >>> 0;
    if (!this.inFrom(old)) return;
    const next = (this.toNet | (old & ~this.toMask)) >>> 0;
    const words = [[old >>> 16, next >>> 16], [old & 0xffff, next & 0xffff]];
    words.forEach(([o, n], w) => {
      put16(d, at + 2 * w, n);
      put16(d, ipSum, csumUpdate16(be16(d, ipSum), o, n));
      if (l4Sum) put16(d, l4Sum, csumUpdate16(be16(d, l4Sum), o, n));
    });
  }

  process(batch) {
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      if (!p.isIpv4() || (!this.inFrom(p.ipv4Src()) && !this.inFrom(p.ipv4Dst()))) continue;
      const l3 = p.l3Offset, l4 = p.l4Offset, n = p.data.length, proto = p.ipProto();
      let l4Sum = 0;
      if (l4 !== NO_L4) {
        if (proto === 6 && l4 + 18 <= n) l4Sum = l4 + 16;
        if (proto === 17 && l4 + 8 <= n && be16(p.data, l4 + 6) !== 0) l4Sum = l4 + 6;
      }
      const d = new Uint8Array(p.data);
      this.translate(d, l3 + 12, l3 + 10, l4Sum);
      this.translate(d, l3 + 16, l3 + 10, l4Sum);
      if (proto === 17 && l4Sum && be16(d, l4Sum) === 0) put16(d, l4Sum, 0xffff);
      batch.rewrite(i, d);
    }
  }
}

export const nf = exportNf(Rewriter);
