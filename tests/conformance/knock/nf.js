// Port knocking on a single-writer byte table `stage` (key-size 4: the
// IPv4 source address in network order; max-value-size 1;
// sync-interval-ns 10,000,000): a source that sends TCP SYNs to ports
// 7000, 8000 and 9000, in that order, may then open connections to port
// 22. A TCP packet is an IPv4 packet whose whole TCP header was
// captured; a knock is a TCP SYN without ACK. Each knock, in packet
// order, reads its source's stage s with one `get-many` (0 when absent,
// else the value's byte), then: to port 22, it is forwarded when s is 3
// and dropped otherwise; to port 7000, 8000 or 9000 when that is the
// next port of the sequence (s < 3 and the port is the (s+1)-th), one
// `put-many` sets the stage to s + 1; to any other port while 0 < s < 3,
// one `put-many` removes the key (an empty value: the sequence starts
// over). Knocks to other ports than 22 are forwarded; every other packet
// is forwarded and touches no table. A stage of 3 stays. Each packet sees
// the writes of the packets before it, in the same batch too.
import { Bytes, DROP, TCP_ACK, TCP_SYN, exportNf, frame, stateless, unframe } from "@sluice/nf";

// The ports to knock on, in order; the stage of a source that knocked them
// all; the port they open.
const SEQUENCE = [7000, 8000, 9000];
const OPENED = 3;
const GUARDED = 22;

const be32 = (v) => Uint8Array.of(v >>> 24, (v >>> 16) & 0xff, (v >>> 8) & 0xff, v & 0xff);

class Knock {
  init(config) {
    this.stage = Bytes.singleWriter("stage", 4, 1, 10_000_000n);
    return stateless();
  }

  // The stage of a source (network order): one get-many.
  stageOf(src) {
    const values = unframe(this.stage.getMany(frame([src])));
    return values.length && values[0].length ? values[0][0] : 0;
  }

  // Sets the stage of a source (an empty value removes it): one put-many.
  setStage(src, value) {
    this.stage.putMany(frame([src, value]));
  }

  process(batch) {
    for (let i = 0; i < batch.length; i++) {
      const p = batch.packet(i);
      if (!p.isIpv4() || !p.isTcp()) continue;
      const flags = p.tcpFlags();
      if ((flags & TCP_SYN) === 0 || (flags & TCP_ACK) !== 0) continue;
      const src = be32(p.ipv4Src());
      const s = this.stageOf(src);
      const port = p.dstPort();
      if (port === GUARDED) {
        if (s !== OPENED) batch.setVerdict(i, DROP);
      } else if (s < OPENED && SEQUENCE[s] === port) {
        this.setStage(src, Uint8Array.of(s + 1));
      } else if (s > 0 && s < OPENED) {
        this.setStage(src, new Uint8Array(0));
      }
    }
  }
}

export const nf = exportNf(Knock);
