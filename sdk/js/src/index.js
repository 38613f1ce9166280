// Write Sluice network functions in JavaScript.
//
// An NF is a class with `init(config: Uint8Array): NfInfo` and
// `process(batch: Batch): void` (and optionally `expired(table, entries)`),
// exported from the NF module as `export const nf = exportNf(MyNf)`. The
// host calls `init` once per instance with the tenant's configuration and
// `process` once per batch of packets, never once per packet. Inside
// `process`, `Batch` gives packet views, per-flow state (including changes
// made earlier in the same batch) and setters for verdicts, rewrites and
// state; none of them calls the host. Throw to refuse a configuration or
// fail a batch: the message goes to the host, which applies the NF's
// failure policy.
//
// The contract is wit/v0.7.0/nf.wit (sluice:nf@0.7.0); componentize-js
// provides the `sluice:nf/*` imports when it builds the NF. A batch comes
// in as one frame of bytes and its answer goes back as one (no object per
// rewrite, state change or offload request crosses the boundary).

import { emit as hostEmit, log as hostLog } from "sluice:nf/host-log@0.7.0";
import {
  offload as hostOffload,
  revoke as hostRevoke,
  revokeAll as hostRevokeAll,
} from "sluice:nf/offload@0.7.0";
import {
  acquire,
  counterAdd,
  counterGet,
  declare,
  getMany,
  lookup,
  putMany,
  release,
  scan,
  topK,
} from "sluice:nf/state@0.7.0";

/** Drop the packet. */
export const DROP = 0;
/** Flow index of a packet without a flow (not IP). */
export const NO_FLOW = 0xffff;
export const NO_L4 = 0xffff;
export const NO_L3 = 0xff;
export const FLAG_REVERSE = 1, FLAG_FRAGMENT = 2, FLAG_TRUNCATED = 4, FLAG_IPV6 = 8;
export const TCP_FIN = 0x01, TCP_SYN = 0x02, TCP_RST = 0x04, TCP_ACK = 0x10;

/** Verdict: forward out of `port` (0: the default output). */
export function forward(port = 0) {
  return ((1 << 16) | (port & 0xffff)) >>> 0;
}

/** `forward(0)`, every packet's verdict until the NF sets another. */
const FORWARD_0 = 1 << 16;

/** Verdict: send to the chain branch selected by `value`. */
export function label(value) {
  return ((2 << 16) | (value & 0xffff)) >>> 0;
}

/** What a stateless NF returns from `init`. */
export function stateless() {
  return { wantsFlowState: false, flowIdleTimeoutNs: 0n };
}

/** What an NF keeping per-flow state returns from `init` (0: 120 s). */
export function withFlowState(idleTimeoutNs = 0n) {
  return { wantsFlowState: true, flowIdleTimeoutNs: BigInt(idleTimeoutNs) };
}

/** A line in the host log; level is "debug", "info", "warn" or "error". */
export function log(level, message) {
  hostLog(level, message);
}

/** Sends events now, in one call, outside a batch (e.g. from `expired`):
 * each `{ kind, level, fields }`. */
export function emit(events) {
  if (events.length) hostEmit(events.map((e) => ({ kind: e.kind, level: e.level, packet: undefined, fields: e.fields })));
}

/** The value of `key` in a config of `key=value` lines, or undefined. */
export function configValue(config, key) {
  const text = new TextDecoder().decode(config);
  for (const raw of text.split("\n")) {
    const line = raw.trim();
    const eq = line.indexOf("=");
    if (line.startsWith("#") || eq < 0) continue;
    if (line.slice(0, eq).trim() === key) return line.slice(eq + 1).trim();
  }
  return undefined;
}

/** The value of `key` as a string, or `def` when the config has no such
 * key (an empty value, `key =`, is ""). */
export function configString(config, key, def = "") {
  const v = configValue(config, key);
  return v === undefined ? def : v;
}

/** The value of `key` as an integer (a number), or `def` when the config
 * has no such key. The value is decimal digits with an optional sign
 * (`30000`, `-7`, `+3`); nothing else is accepted, so every SDK reads a
 * config the same way. Throws an Error naming the key and the value
 * (`capacity = 12k: not an integer`), which refuses the configuration when
 * thrown in `init`; a value beyond ±(2^53 - 1), which a number cannot hold
 * exactly, is `integer out of range`. */
export function configInt(config, key, def = 0) {
  const v = configValue(config, key);
  if (v === undefined) return def;
  if (!/^[+-]?[0-9]+$/.test(v)) throw new Error(`${key} = ${v}: not an integer`);
  const n = Number(v);
  if (!Number.isSafeInteger(n)) throw new Error(`${key} = ${v}: integer out of range`);
  return n === 0 ? 0 : n; // "-0" reads as 0, as in the other SDKs
}

/** The value of `key` as a number, or `def` when the config has no such
 * key. The value is a decimal number with an optional sign, fraction and
 * exponent (`1.5`, `.5`, `2e-3`, `3`); `Infinity`, `NaN`, hexadecimal and
 * values too large for a double throw (`rate = fast: not a number`). */
export function configFloat(config, key, def = 0) {
  const v = configValue(config, key);
  if (v === undefined) return def;
  const f = /^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?$/.test(v) ? Number(v) : NaN;
  if (!Number.isFinite(f)) throw new Error(`${key} = ${v}: not a number`);
  return f;
}

/** The value of `key` as a boolean, or `def` when the config has no such
 * key: `true`, `yes`, `on`, `1` are true and `false`, `no`, `off`, `0`
 * false, in any case; anything else throws (`log = maybe: not a boolean
 * (true/false, yes/no, on/off, 1/0)`). */
export function configBool(config, key, def = false) {
  const v = configValue(config, key);
  if (v === undefined) return def;
  const word = v.toLowerCase();
  if (["true", "yes", "on", "1"].includes(word)) return true;
  if (["false", "no", "off", "0"].includes(word)) return false;
  throw new Error(`${key} = ${v}: not a boolean (true/false, yes/no, on/off, 1/0)`);
}

/** `a.b.c.d[/n]` as [network, mask] (unsigned 32-bit numbers). */
export function parseIpv4Cidr(text) {
  const [addr, len, ...rest] = text.split("/");
  const parts = addr.split(".");
  if (rest.length || parts.length !== 4 || !parts.every((p) => /^\d{1,3}$/.test(p) && Number(p) <= 255)) {
    throw new Error(`bad IPv4 address in '${text}'`);
  }
  const n = len === undefined ? 32 : /^\d+$/.test(len) ? Number(len) : NaN;
  if (!(n >= 0 && n <= 32)) throw new Error(`bad prefix length in '${text}'`);
  const a = parts.reduce((acc, p) => ((acc << 8) | Number(p)) >>> 0, 0);
  const mask = n === 0 ? 0 : (0xffffffff << (32 - n)) >>> 0;
  return [(a & mask) >>> 0, mask];
}

/** RFC 1624 incremental update of a one's-complement checksum. */
export function csumUpdate16(checksum, oldWord, newWord) {
  let s = (~checksum & 0xffff) + (~oldWord & 0xffff) + newWord;
  s = (s & 0xffff) + (s >>> 16);
  s = (s & 0xffff) + (s >>> 16);
  return ~s & 0xffff;
}

/** Bytes `start` to `end` of `a` as a view, as `a.subarray(start, end)`
 * (clamped the same way) gives them, without subarray's species lookup:
 * the engine inside the component interprets that as self-hosted script,
 * about ten times the cost of making the view directly (3 µs a view). */
function view(a, start, end) {
  const e = end < a.length ? (end > 0 ? end : 0) : a.length;
  const b = start < e ? (start > 0 ? start : 0) : e;
  return new Uint8Array(a.buffer, a.byteOffset + b, e - b);
}

/** A copy of bytes `x` (a typed array, an array of numbers) as a new
 * Uint8Array, as `Uint8Array.from(x)` makes it, without the iterator
 * protocol `from` runs per element in the interpreter (about 1 µs a byte:
 * 70 µs for a 64-byte frame). */
function copyBytes(x) {
  if (typeof x?.length !== "number") return Uint8Array.from(x);
  const out = new Uint8Array(x.length >>> 0);
  out.set(x);
  return out;
}

/** `xs` (numbers or bigints) as a BigUint64Array, or a BigInt64Array with
 * `signed`, element by element (`BigUint64Array.from(xs, BigInt)` runs its
 * mapping through the interpreter's self-hosted `from`, several times
 * slower). */
function bigints(xs, signed) {
  const a = signed ? new BigInt64Array(xs.length) : new BigUint64Array(xs.length);
  for (let i = 0; i < xs.length; i++) a[i] = BigInt(xs[i]);
  return a;
}

function be16(d, at) {
  return (d[at] << 8) | d[at + 1];
}

function be32(d, at) {
  return ((d[at] << 24) | (d[at + 1] << 16) | (d[at + 2] << 8) | d[at + 3]) >>> 0;
}

/** One packet of a batch: its bytes and what the host parsed out of them.
 *
 * The engine inside the component interprets: a call costs about 250 ns, a
 * getter about 370 ns and a typed-array view about 650 ns, while a stored
 * field reads for a few. So a packet stores the fields most NFs read, makes
 * its `data` view only when asked, and each accessor reads the batch's
 * bytes without calling another. */
export class Packet {
  constructor(batch, i, start, end, wireLen, lo3, hi3) {
    this.batch = batch;
    this.index = i;
    this.start = start;
    this.end = end;
    this.wireLen = wireLen;
    this.flow = lo3 & 0xffff;
    this.l4Offset = hi3 & 0xffff;
    this.l3Offset = (hi3 >>> 16) & 0xff;
    this.flags = hi3 >>> 24;
    this._data = undefined;
  }

  /** The packet's bytes: a view into the batch (made on first use). */
  get data() {
    if (this._data === undefined) {
      const d = this.batch.data;
      this._data = new Uint8Array(d.buffer, d.byteOffset + this.start, this.end - this.start);
    }
    return this._data;
  }

  get ingressPort() {
    return this.batch.words[8 * this.index + 6] >>> 16;
  }

  /** Arrival time, ns since the Unix epoch (bigint). */
  get timestampNs() {
    return this.batch.descriptors[4 * this.index + 1];
  }

  /** Symmetric flow hash (bigint; 0n without a flow). */
  get flowHash() {
    return this.batch.descriptors[4 * this.index + 2];
  }

  // The IP accessors rely on the contract's l3 offset (sluice:nf@0.7.0):
  // the host sets it only behind a whole, well-formed IPv4 or IPv6 header.

  /** An IPv4 packet whose whole IP header was captured. */
  isIpv4() {
    return this.l3Offset !== NO_L3 && (this.flags & FLAG_IPV6) === 0;
  }

  /** The IP protocol (for IPv6 the first next header); 0 if not IP. */
  ipProto() {
    const l3 = this.l3Offset;
    if (l3 === NO_L3) return 0;
    return this.batch.data[this.start + l3 + (this.flags & FLAG_IPV6 ? 6 : 9)];
  }

  ipv4Src() {
    const l3 = this.l3Offset;
    return l3 !== NO_L3 && (this.flags & FLAG_IPV6) === 0 ? be32(this.batch.data, this.start + l3 + 12) : 0;
  }

  ipv4Dst() {
    const l3 = this.l3Offset;
    return l3 !== NO_L3 && (this.flags & FLAG_IPV6) === 0 ? be32(this.batch.data, this.start + l3 + 16) : 0;
  }

  /** An IPv6 packet whose fixed 40-byte IP header was captured. */
  isIpv6() {
    return this.l3Offset !== NO_L3 && (this.flags & FLAG_IPV6) !== 0;
  }

  /** IPv6 source address: its 16 bytes in network order (a copy), or
   * undefined if not IPv6. */
  ipv6Src() {
    const at = this.start + this.l3Offset;
    return this.isIpv6() ? copyBytes(view(this.batch.data, at + 8, at + 24)) : undefined;
  }

  /** IPv6 destination address: its 16 bytes in network order (a copy), or
   * undefined if not IPv6. */
  ipv6Dst() {
    const at = this.start + this.l3Offset;
    return this.isIpv6() ? copyBytes(view(this.batch.data, at + 24, at + 40)) : undefined;
  }

  // The transport accessors rely on the contract's l4 offset: the host
  // sets it only behind a whole IP header and a whole TCP (options
  // included) or UDP header, so one read of the protocol byte decides.

  /** A TCP packet whose whole TCP header was captured. */
  isTcp() {
    const l4 = this.l4Offset, l3 = this.l3Offset;
    if (l4 === NO_L4 || l3 === NO_L3) return false;
    return this.batch.data[this.start + l3 + (this.flags & FLAG_IPV6 ? 6 : 9)] === 6;
  }

  /** A UDP packet whose UDP header was captured. */
  isUdp() {
    const l4 = this.l4Offset, l3 = this.l3Offset;
    if (l4 === NO_L4 || l3 === NO_L3) return false;
    return this.batch.data[this.start + l3 + (this.flags & FLAG_IPV6 ? 6 : 9)] === 17;
  }

  srcPort() {
    const l4 = this.l4Offset, l3 = this.l3Offset;
    if (l4 === NO_L4 || l3 === NO_L3) return 0;
    const d = this.batch.data, proto = d[this.start + l3 + (this.flags & FLAG_IPV6 ? 6 : 9)];
    return proto === 6 || proto === 17 ? be16(d, this.start + l4) : 0;
  }

  dstPort() {
    const l4 = this.l4Offset, l3 = this.l3Offset;
    if (l4 === NO_L4 || l3 === NO_L3) return 0;
    const d = this.batch.data, proto = d[this.start + l3 + (this.flags & FLAG_IPV6 ? 6 : 9)];
    return proto === 6 || proto === 17 ? be16(d, this.start + l4 + 2) : 0;
  }

  /** TCP flags byte, 0 if not TCP. */
  tcpFlags() {
    const l4 = this.l4Offset, l3 = this.l3Offset;
    if (l4 === NO_L4 || l3 === NO_L3) return 0;
    const d = this.batch.data, start = this.start;
    return d[start + l3 + (this.flags & FLAG_IPV6 ? 6 : 9)] === 6 ? d[start + l4 + 13] : 0;
  }
}

// A flow's state in this batch: as handed in (not read yet), set, removed,
// or read (its view kept in `newStates`).
const KEEP = 0, SET = 1, REMOVE = 2, READ = 3;

/** A batch of packets with their flow state, plus the NF's decisions.
 * Every packet starts with the verdict `forward(0)`. */
export class Batch {
  /** The batch frame (sluice:nf@0.7.0): packet bytes, padding to 8,
   * 32-byte descriptors, flow states, returns of ended offload entries,
   * and a 16-byte trailer that says how long each part is. */
  constructor(frame) {
    const size = frame.length;
    if (size < 16) throw new Error(`batch frame of ${size} bytes: shorter than its 16-byte trailer`);
    // Read inline: a call costs the interpreter more than the reads.
    const t = size - 16;
    const n = (frame[t] | (frame[t + 1] << 8) | (frame[t + 2] << 16) | (frame[t + 3] << 24)) >>> 0;
    const dataLen = (frame[t + 4] | (frame[t + 5] << 8) | (frame[t + 6] << 16) | (frame[t + 7] << 24)) >>> 0;
    const statesLen = (frame[t + 8] | (frame[t + 9] << 8) | (frame[t + 10] << 16) | (frame[t + 11] << 24)) >>> 0;
    const returnsLen = (frame[t + 12] | (frame[t + 13] << 8) | (frame[t + 14] << 16) | (frame[t + 15] << 24)) >>> 0;
    const first = dataLen + ((8 - (dataLen % 8)) % 8);
    const statesAt = first + 32 * n;
    if (statesAt + statesLen + returnsLen + 16 !== size || returnsLen % RETURN_BYTES !== 0) {
      throw new Error(
        `batch frame of ${size} bytes: its trailer says ${n} packets, ${dataLen} data bytes, ` +
          `${statesLen} flow-state bytes, ${returnsLen} return bytes`,
      );
    }
    this.returnsAt = statesAt + statesLen;
    this.returnsLen = returnsLen;
    this.data = new Uint8Array(frame.buffer, frame.byteOffset, dataLen);
    // The descriptors in place where the frame is 8-aligned (a copy of
    // them otherwise), as 64-bit words and as 32-bit halves (little-endian),
    // so the hot fields are read without BigInt arithmetic.
    let buf = frame.buffer, off = frame.byteOffset + first;
    if (off % 8 !== 0) {
      buf = frame.slice(first, statesAt).buffer;
      off = 0;
    }
    // The 64-bit view is made when a bigint field is read (a view costs
    // about 650 ns, and most NFs read none).
    this._descriptors = undefined;
    this._descriptorsAt = [buf, off];
    this.words = new Uint32Array(buf, off, 8 * n);
    this.length = n;
    this.verdicts = new Uint32Array(n).fill(FORWARD_0);
    // Made on the first rewrite.
    this.rewrites = undefined;
    this.events = [];
    // Flow states: where each one starts and how long it is; a state's
    // view is made when the NF reads it (a view costs about 650 ns).
    const end = statesAt + statesLen;
    this.frame = frame;
    const stateAt = [], stateLen = [];
    let flows = 0;
    for (let at = statesAt; at + 4 <= end; flows++) {
      const len = (frame[at] | (frame[at + 1] << 8) | (frame[at + 2] << 16) | (frame[at + 3] << 24)) >>> 0;
      if (len > end - at - 4) break;
      stateAt[flows] = at + 4;
      stateLen[flows] = len;
      at += 4 + len;
    }
    this.stateAt = stateAt;
    this.stateLen = stateLen;
    this.flowCount = flows;
    this.pending = new Uint8Array(this.flowCount);
    this.newStates = new Array(this.flowCount);
    this._packets = undefined;
    this.offloads = [];
    this.returns = undefined;
  }

  /** The descriptors as 64-bit words (four per packet). */
  get descriptors() {
    let d = this._descriptors;
    if (d === undefined) {
      const [buf, off] = this._descriptorsAt;
      d = this._descriptors = new BigUint64Array(buf, off, 4 * this.length);
    }
    return d;
  }

  /** Packet `i` (0 <= i < length). */
  packet(i) {
    if (!(i >= 0 && i < this.length)) throw new RangeError(`packet ${i} of a batch of ${this.length}`);
    return this.packets()[i];
  }

  /** All packets in order: an array, made once per batch. */
  packets() {
    let ps = this._packets;
    if (ps === undefined) {
      const w = this.words, n = this.length;
      ps = this._packets = new Array(n);
      for (let i = 0, b = 0, start = 0; i < n; i++, b += 8) {
        const end = w[b];
        ps[i] = new Packet(this, i, start, end, w[b + 1], w[b + 6], w[b + 7]);
        start = end;
      }
    }
    return ps;
  }

  setVerdict(i, verdict) {
    if (i >= 0 && i < this.length) this.verdicts[i] = verdict;
  }

  /** The state of `flow` as of now, or undefined if it has none. */
  flowState(flow) {
    if (!(flow >= 0 && flow < this.flowCount)) return undefined;
    switch (this.pending[flow]) {
      case SET:
      case READ:
        return this.newStates[flow];
      case REMOVE:
        return undefined;
      default: {
        const len = this.stateLen[flow];
        const state = len ? new Uint8Array(this.frame.buffer, this.frame.byteOffset + this.stateAt[flow], len) : undefined;
        this.pending[flow] = READ;
        this.newStates[flow] = state;
        return state;
      }
    }
  }

  /** Stores `state` (1..4096 bytes) for `flow`. */
  setFlowState(flow, state) {
    if (!(flow >= 0 && flow < this.flowCount)) return;
    if (!state.length) return this.removeFlowState(flow);
    this.pending[flow] = SET;
    this.newStates[flow] = copyBytes(state);
  }

  /** Forgets the state of `flow`. */
  removeFlowState(flow) {
    if (!(flow >= 0 && flow < this.flowCount)) return;
    this.pending[flow] = REMOVE;
    this.newStates[flow] = undefined;
  }

  /** Replaces the bytes of packet `i`. */
  rewrite(i, data) {
    if (i >= 0 && i < this.length) (this.rewrites ??= new Map()).set(i, copyBytes(data));
  }

  /** Queues an event; a batch's events reach the host in one call. */
  emit(kind, level, packet, fields) {
    this.events.push({ kind, level, packet: packet ?? undefined, fields: fields.map(([k, v]) => [k, v]) });
  }

  /** Sends the queued events (also when the batch failed, as the other
   * SDKs do: events emitted before a failure are delivered). */
  flushEvents() {
    if (this.events.length) hostEmit(this.events);
    this.events = [];
  }

  /** Offloads the flow of packet `i` (flow offload, sluice:nf@0.5.0): its
   * later packets in its direction get this packet's verdict, plus
   * `rewrites` (`setSource`, `setDestination`, `decrementTtl`, `setDscp`;
   * at most 8), without a call to the NF, until a TCP FIN or RST (that
   * packet comes to the NF), `idleTimeoutNs` without a packet (0: the NF's
   * flow idle timeout), `maxPackets`, `maxBytes` or `maxAgeNs` (0: no
   * limit), a revoke, or a new version. With `counts` (the default) what
   * passed under the entry comes back through `offloadReturns()`; an NF
   * that counts nothing per packet passes `counts: false`. The requests go
   * to the host in one call when `process` returns; a refused one simply
   * makes no entry (call `offloadNow` to see refusals). */
  offload(i, { rewrites = [], idleTimeoutNs = 0, maxPackets = 0, maxBytes = 0, maxAgeNs = 0, counts = true } = {}) {
    // One change more than allowed is enough for the host to refuse.
    const ops = Array.isArray(rewrites) ? rewrites : [...rewrites];
    this.offloads.push({
      packet: i >>> 0,
      rewrites: ops.length > 9 ? ops.slice(0, 9) : ops,
      idleTimeoutNs,
      maxPackets,
      maxBytes,
      maxAgeNs,
      returnCounts: !!counts,
    });
  }

  /** What passed under this NF's offload entries that ended since the last
   * batch, one per entry: `{ flow, flowHash, key, reverse, packets, bytes,
   * reason }` (`flow`: the flow's index in this batch when a packet of it
   * is here, else undefined; `packets`, `bytes`, `flowHash`: bigint;
   * `reason`: "closed", "limit", "idle", "revoked" or "replaced"). Add
   * them to whatever the NF counts per packet. They come with the batch
   * (also entries carried here from another host with their flows); each
   * is handed in once. */
  offloadReturns() {
    let returns = this.returns;
    if (returns === undefined) {
      const count = this.returnsLen / RETURN_BYTES;
      returns = this.returns = new Array(count);
      if (count) {
        const f = this.frame, at = this.returnsAt;
        const dv = new DataView(f.buffer, f.byteOffset + at, this.returnsLen);
        for (let k = 0, o = 0; k < count; k++, o += RETURN_BYTES) {
          const flow = dv.getUint32(o + 24, true);
          returns[k] = {
            flow: flow === 0xffffffff ? undefined : flow,
            flowHash: dv.getBigUint64(o, true),
            key: copyBytes(view(f, at + o + 32, at + o + 69)),
            reverse: f[at + o + 28] !== 0,
            packets: dv.getBigUint64(o + 8, true),
            bytes: dv.getBigUint64(o + 16, true),
            reason: END_REASONS[f[at + o + 29]] ?? "replaced",
          };
        }
      }
    }
    return returns;
  }

  /** The result frame (wit/v0.7.0/nf.wit, `nf.process`): verdicts,
   * rewrites, flow-state changes, offload requests and the trailer. */
  finish() {
    if (this.events.length) this.flushEvents();
    const n = this.length, pending = this.pending, flows = this.flowCount, states = this.newStates;
    // Sizes first, by plain loops (the interpreter runs spread, sort and
    // map as self-hosted script), then one buffer and one DataView.
    let rewritesLen = 0, updatesLen = 0, offloadsLen = 0;
    const rewrites = this.rewrites;
    if (rewrites !== undefined) for (const d of rewrites.values()) rewritesLen += 8 + d.length;
    for (let flow = 0; flow < flows; flow++) {
      const op = pending[flow];
      if (op === SET) updatesLen += 8 + states[flow].length;
      else if (op === REMOVE) updatesLen += 8;
    }
    const offloads = this.offloads;
    for (let k = 0; k < offloads.length; k++) offloadsLen += OFFLOAD_HEAD + OFFLOAD_OP * offloads[k].rewrites.length;
    const total = 4 * n + rewritesLen + updatesLen + offloadsLen + 16;
    const out = new Uint8Array(total);
    if (n) out.set(new Uint8Array(this.verdicts.buffer, 0, 4 * n));
    const dv = new DataView(out.buffer);
    let at = 4 * n;
    if (rewritesLen) {
      for (let i = 0; i < n; i++) {
        const d = rewrites.get(i);
        if (d === undefined) continue;
        dv.setUint32(at, i, true);
        dv.setUint32(at + 4, d.length, true);
        out.set(d, at + 8);
        at += 8 + d.length;
      }
    }
    if (updatesLen) {
      for (let flow = 0; flow < flows; flow++) {
        const op = pending[flow];
        if (op === SET) {
          const v = states[flow];
          dv.setUint32(at, flow, true);
          dv.setUint32(at + 4, v.length, true);
          out.set(v, at + 8);
          at += 8 + v.length;
        } else if (op === REMOVE) {
          dv.setUint32(at, flow, true);
          at += 8;
        }
      }
    }
    for (let k = 0; k < offloads.length; k++) at = putOffload(out, dv, at, offloads[k]);
    dv.setUint32(at, n, true);
    dv.setUint32(at + 4, rewritesLen, true);
    dv.setUint32(at + 8, updatesLen, true);
    dv.setUint32(at + 12, offloadsLen, true);
    this.offloads = [];
    return out;
  }
}

/** Bytes of a return in the batch frame, of an offload request's head and
 * of one of its header changes in the result frame. */
const RETURN_BYTES = 72, OFFLOAD_HEAD = 40, OFFLOAD_OP = 24;
/** `reason` of an offload return, by the contract's end-reason code. */
const END_REASONS = ["closed", "limit", "idle", "revoked", "replaced"];
/** A header change's kind code in the result frame. */
const OP_KINDS = { source: 0, destination: 1, "decrement-ttl": 2, "set-dscp": 3 };

/** Writes an unsigned 64-bit `v` (a number or a bigint) at `at`. */
function putU64(dv, at, v) {
  if (typeof v === "bigint") dv.setBigUint64(at, BigInt.asUintN(64, v), true);
  else {
    const x = v > 0 ? Math.floor(v) : 0;
    dv.setUint32(at, x % 0x100000000, true);
    dv.setUint32(at + 4, Math.min(Math.floor(x / 0x100000000), 0xffffffff), true);
  }
}

/** Writes one offload request (head and header changes) at `at`; returns
 * where the next goes. */
function putOffload(out, dv, at, r) {
  const ops = r.rewrites;
  dv.setUint32(at, r.packet, true);
  out[at + 4] = ops.length;
  out[at + 5] = r.returnCounts ? 1 : 0;
  putU64(dv, at + 8, r.idleTimeoutNs);
  putU64(dv, at + 16, r.maxPackets);
  putU64(dv, at + 24, r.maxBytes);
  putU64(dv, at + 32, r.maxAgeNs);
  at += OFFLOAD_HEAD;
  for (let j = 0; j < ops.length; j++, at += OFFLOAD_OP) {
    const op = ops[j];
    const kind = OP_KINDS[op?.tag] ?? 255;
    out[at] = kind;
    if (kind === 0 || kind === 1) {
      const a = op.val.address, port = op.val.port;
      // An address of another length than 4 or 16 is the host's to refuse.
      out[at + 1] = Math.min(a.length, 255);
      if (port !== undefined && port !== null) {
        out[at + 2] = 1;
        dv.setUint16(at + 4, port, true);
      }
      out.set(a.length > 16 ? view(a, 0, 16) : a, at + 8);
    } else if (kind === 3) {
      // Above 63 is the host's to refuse.
      const d = op.val;
      out[at + 3] = d >= 0 && d <= 255 ? d : 255;
    }
  }
  return at;
}

/** An offload change: later packets get this sender address (4 or 16
 * bytes) and, for TCP and UDP, `port` (undefined: the port stays). */
export function setSource(address, port) {
  return { tag: "source", val: { address: copyBytes(address), port } };
}

/** An offload change: later packets get this receiver address and port. */
export function setDestination(address, port) {
  return { tag: "destination", val: { address: copyBytes(address), port } };
}

/** An offload change: later packets' TTL or hop limit is lowered by one. */
export function decrementTtl() {
  return { tag: "decrement-ttl" };
}

/** An offload change: later packets get this DSCP (0 to 63). */
export function setDscp(dscp) {
  return { tag: "set-dscp", val: dscp };
}

/** Why the host made no entry for an offload request: `kind` is
 * "not-now", "bad-packet", "not-offloadable", "bad-rewrite" or
 * "over-budget"; `detail` says more for the two that carry text. */
export class OffloadError extends Error {
  constructor(kind, detail) {
    super(detail !== undefined ? `offload: ${kind}: ${detail}` : `offload: ${kind}`);
    this.name = "OffloadError";
    this.kind = kind;
    this.detail = detail;
  }
}

/** Sends `batch`'s offload requests now instead of when `process`
 * returns: one result per request, undefined where an entry was made, else
 * an `OffloadError`. */
export function offloadNow(batch) {
  if (!batch.offloads.length) return [];
  const results = sendOffloads(batch);
  const out = new Array(results.length);
  for (let k = 0; k < results.length; k++) {
    const r = results[k];
    out[k] = r && r.tag === "err" ? new OffloadError(r.val.tag, typeof r.val.val === "string" ? r.val.val : undefined) : undefined;
  }
  return out;
}

/** Sends `batch`'s offload requests through the `offload` call: the
 * host's results. */
function sendOffloads(batch) {
  const requests = batch.offloads;
  batch.offloads = [];
  const records = new Array(requests.length);
  for (let k = 0; k < requests.length; k++) {
    const r = requests[k];
    records[k] = {
      packet: r.packet,
      rewrites: r.rewrites,
      idleTimeoutNs: u64(r.idleTimeoutNs),
      maxPackets: u64(r.maxPackets),
      maxBytes: u64(r.maxBytes),
      maxAgeNs: u64(r.maxAgeNs),
      returnCounts: r.returnCounts,
    };
  }
  return hostOffload(records);
}

/** A u64 the contract carries (0n without a BigInt conversion). */
function u64(n) {
  return n ? BigInt(n) : 0n;
}

/** Which flow directions have proved long enough to offload: a count of
 * each direction's packets in the instance's own memory. An entry costs the
 * host a request, an install and an end, which a flow that ends a few
 * packets later does not repay where a call is cheap; `admit(p)` is true
 * once p's direction has carried `after` packets the NF would have
 * offloaded (0 and 1: at once), as flow caches admit only flows that have
 * proved long. The counts live in a table of `slots` flows (a power of two,
 * at least 4, at most 2^20), four ways per hash (a new flow takes the place
 * of the one with the fewest packets there), in typed arrays (no object per
 * flow): a count lost to another flow, another worker or a restart only
 * delays the entry, and two flows that share a slot and the hash's upper
 * half (one in 2^42 at 4,096 slots) only share counts. Nothing here changes
 * a verdict.
 *
 * Written for the interpreter that runs inside the component: a packet is
 * counted with a few typed-array reads (the slot's set from the hash's lower
 * half, its tag the upper half), no method call and no BigInt. */
export class Admission {
  constructor(after, slots = 4096) {
    this.after = after;
    let n = 4;
    while (n < Math.min(slots, 1 << 20)) n *= 2;
    this.mask = after > 1 ? n / 4 - 1 : 0;
    // Per slot: the flow hash's upper half, and a count per direction.
    this.tags = new Uint32Array(after > 1 ? n : 0);
    this.counts = new Uint32Array(after > 1 ? 2 * n : 0);
  }

  /** Counts `p` in its flow's direction; true once that direction has
   * carried `after` counted packets. */
  admit(p) {
    const after = this.after;
    if (after <= 1) return true;
    const w = p.batch.words, at = 8 * p.index + 4;
    const tag = w[at + 1], tags = this.tags, counts = this.counts;
    let k = (w[at] & this.mask) << 2;
    if (tags[k] !== tag && tags[++k] !== tag && tags[++k] !== tag && tags[++k] !== tag) k = this.take(k - 3, tag);
    const c = 2 * k + (p.flags & FLAG_REVERSE);
    const n = counts[c];
    if (n >= after) return true;
    counts[c] = n + 1;
    return n + 1 >= after;
  }

  /** The slot of set `set` (its first slot) with the fewest packets, given
   * to the flow with tag `tag`. */
  take(set, tag) {
    const counts = this.counts;
    let best = set, fewest = counts[2 * set] + counts[2 * set + 1];
    for (let k = set + 1; k < set + 4; k++) {
      const n = counts[2 * k] + counts[2 * k + 1];
      if (n < fewest) {
        best = k;
        fewest = n;
      }
    }
    this.tags[best] = tag;
    counts[2 * best] = 0;
    counts[2 * best + 1] = 0;
    return best;
  }

  /** Forgets the counts of `p`'s flow (a new connection on its 5-tuple). */
  forget(p) {
    if (this.after <= 1) return;
    const w = p.batch.words, at = 8 * p.index + 4;
    const tag = w[at + 1], tags = this.tags;
    const set = (w[at] & this.mask) << 2;
    for (let k = set; k < set + 4; k++) {
      if (tags[k] === tag) {
        this.counts[2 * k] = 0;
        this.counts[2 * k + 1] = 0;
        return;
      }
    }
  }
}

/** Ends this worker's entries of the flows with these hashes
 * (`packet.flowHash`, bigint), both directions, when the batch is done. */
export function revoke(flowHashes) {
  if (flowHashes.length) hostRevoke(bigints(flowHashes, false));
}

/** Ends every entry of this NF on this worker when the batch is done. */
export function revokeAll() {
  hostRevokeAll();
}

const ITEM_ERRORS = ["bad-input", "full", "over-budget", "too-large"];

/** A host table operation failed; nothing traps, the NF decides.
 *
 * - `op`: the call (`"declare"`, `"counter-add"`, `"put-many"`, ...);
 * - `kind`: the contract's state-error case: `"unknown-table"`,
 *   `"not-now"`, `"wrong-kind"`, `"bad-spec"`, `"incompatible"`,
 *   `"bad-input"`, `"full"`, `"over-budget"` or `"too-large"`;
 * - `item`: for `bad-input`, `full`, `over-budget` and `too-large`, the
 *   index of the item the call stopped at (the key of `add`, the key-value
 *   entry of `putMany`, the value of `acquire`): the items before it were
 *   applied, it and the ones after it were not. undefined otherwise;
 * - `detail`: the host's reason for `bad-spec` and `incompatible`. */
export class StateError extends Error {
  constructor(op, kind, item, detail) {
    super(
      detail !== undefined ? `${op}: ${kind}: ${detail}` : item !== undefined ? `${op}: ${kind} at item ${item}` : `${op}: ${kind}`,
    );
    this.name = "StateError";
    this.op = op;
    this.kind = kind;
    this.item = item;
    this.detail = detail;
  }
}

function stateCall(what, f) {
  try {
    return f();
  } catch (e) {
    const p = e && e.payload !== undefined ? e.payload : e;
    if (!p || typeof p.tag !== "string") throw new StateError(what, String(p));
    if (ITEM_ERRORS.includes(p.tag)) throw new StateError(what, p.tag, p.val);
    if (p.tag === "bad-spec" || p.tag === "incompatible") throw new StateError(what, p.tag, undefined, p.val);
    if (p.tag === "unknown-table") throw new StateError(what, p.tag, undefined, `table ${p.val}`);
    throw new StateError(what, p.tag);
  }
}

/** The most entries one `scan` page and one `topK` hold (the host's bound). */
export const SCAN_MAX = 1024;

const NO_CURSOR = new Uint8Array(0);

function scanPage(what, table, cursor, limit) {
  return stateCall(what, () => scan(table, cursor ?? NO_CURSOR, limit));
}

/** Pairs of a framed key, value, key, value, ... list. */
function pairs(framed) {
  const items = unframe(framed);
  const out = [];
  for (let i = 0; i + 1 < items.length; i += 2) out.push([items[i], items[i + 1]]);
  return out;
}

/** Every entry of a table, one `scan` page at a time. */
function* walk(table, limit) {
  let cursor = NO_CURSOR;
  do {
    const page = table.scan(cursor, limit);
    yield* page.entries;
    cursor = page.cursor;
  } while (cursor.length > 0);
}

/** A host counter table (see the `state` interface of the contract). */
export class Counters {
  constructor(table) {
    this.table = table;
  }

  /** Declares a table from a full spec (only in `init`). */
  static declare(spec) {
    return new Counters(stateCall("declare", () => declare(spec)));
  }

  /** A global counter table whose workers' replicas are summed every
   * `mergeIntervalNs` of packet time (only in `init`): the same as
   * `Counters.eventual(name, "sum", mergeIntervalNs, options)`. */
  static sum(name, mergeIntervalNs = 0n, options = {}) {
    return Counters.eventual(name, "sum", mergeIntervalNs, options);
  }

  /** A global counter table, one replica per worker, merged with `merge`
   * (`"sum"`, `"max"`: the largest value wins, `"min"`) every
   * `mergeIntervalNs` of packet time (0: every batch); only in `init`. For
   * max and min tables, `add` offers its delta as a candidate value.
   * `options.capacity` counts the whole table, over every worker. */
  static eventual(name, merge = "sum", mergeIntervalNs = 0n, options = {}) {
    const consistency = { tag: "eventual", val: { merge, mergeIntervalNs: BigInt(mergeIntervalNs) } };
    return Counters.declare(spec(name, "global", "counter", consistency, 8, options));
  }

  /** A global counter table with one owner worker per key (only in
   * `init`): adds to keys another worker owns are forwarded to it as
   * deltas, so none is lost; reads see the owner's value as published at
   * its last sync plus this worker's own adds since. Owners sync every
   * `syncIntervalNs` of packet time (0: every batch). `options.capacity`
   * counts the whole table, over every worker. */
  static singleWriter(name, syncIntervalNs = 0n, options = {}) {
    return Counters.declare(spec(name, "global", "counter", singleWriter(syncIntervalNs), 8, options));
  }

  /** Counters per flow, keyed by the batch's flow index (only in `init`).
   * `options.capacity` counts one worker's flows; with
   * `options.notifyExpired`, counters idle for `options.idleTimeoutNs`
   * of packet time reach the NF's `expired` (keys: 37-byte flow keys). */
  static perFlow(name, options = {}) {
    return Counters.declare(spec(name, "per-flow", "counter", { tag: "local" }, 8, options));
  }

  /** Global counters written in `init` (with `add`) and replicated to every
   * worker; `process` only reads them (only in `init`). */
  static readOnly(name, options = {}) {
    return Counters.declare(spec(name, "global", "counter", { tag: "local" }, 8, options, "read-only"));
  }

  /** Adds `deltas[i]` to the counter `keys[i]` (for max/min eventual
   * tables: offers the value). A StateError `full`, `over-budget` or
   * `bad-input` carries the index of the key it stopped at (`item`); keys
   * before it were added. */
  add(keys, deltas) {
    const k = bigints(keys, false);
    const d = bigints(deltas, true);
    stateCall("counter-add", () => counterAdd(this.table, k, d));
  }

  /** Reads counters (0n for absent keys). */
  get(keys) {
    return stateCall("counter-get", () => counterGet(this.table, bigints(keys, false)));
  }

  /** One page of the table in ascending key order: `{ entries, cursor }`,
   * up to `limit` `[key, value]` pairs (bigints) after `cursor` (empty:
   * from the start; `limit` 0 or above 1024: 1024) and the cursor of the
   * next page (empty: done). Per-flow tables refuse it (`wrong-kind`).
   * Costs one state operation per entry plus one per call. */
  scan(cursor = NO_CURSOR, limit = 0) {
    const page = scanPage("scan", this.table, cursor, limit);
    return { entries: page.counters.map(([k, v]) => [BigInt(k), BigInt(v)]), cursor: page.cursor };
  }

  /** Every `[key, value]` of the table in ascending key order, one `scan`
   * page of `limit` at a time. */
  *entries(limit = 0) {
    yield* walk(this, limit);
  }

  /** The `k` largest counters (`k` at most 1024) as `[key, value]`
   * bigints, largest first, equal values by ascending key, selected by the
   * host without reading every key. Costs one state operation per pair
   * plus one. */
  topK(k) {
    return stateCall("top-k", () => topK(this.table, k)).map(([key, v]) => [BigInt(key), BigInt(v)]);
  }
}

/** Frames items (Uint8Arrays) the way the state interface takes keys and
 * values: a 4-byte little-endian length, then the bytes, for each. */
export function frame(items) {
  const total = items.reduce((n, it) => n + 4 + it.length, 0);
  const out = new Uint8Array(total);
  let at = 0;
  for (const it of items) {
    new DataView(out.buffer).setUint32(at, it.length, true);
    out.set(it, at + 4);
    at += 4 + it.length;
  }
  return out;
}

/** The items of a framed list (throws if it is cut short). */
export function unframe(data) {
  const items = [];
  for (let at = 0; at < data.length; ) {
    if (at + 4 > data.length) throw new Error(`framing cut short at byte ${at}`);
    const n = (data[at] | (data[at + 1] << 8) | (data[at + 2] << 16) | (data[at + 3] << 24)) >>> 0;
    if (at + 4 + n > data.length) throw new Error(`framing cut short at byte ${at}`);
    items.push(view(data, at + 4, at + 4 + n));
    at += 4 + n;
  }
  return items;
}

/** A full table spec; `options` holds `capacity` (0: the host's default,
 * 65536), `idleTimeoutNs` (0: never) and `notifyExpired`. */
function spec(name, scope, kind, consistency, maxValueSize, options = {}, access = "read-write", keySize = 0) {
  const { capacity = 0, idleTimeoutNs = 0n, notifyExpired = false } = options;
  return {
    name,
    scope,
    access,
    kind,
    consistency,
    keySize,
    maxValueSize,
    capacity,
    idleTimeoutNs: BigInt(idleTimeoutNs),
    notifyExpired,
  };
}

function singleWriter(syncIntervalNs) {
  return { tag: "single-writer", val: { syncIntervalNs: BigInt(syncIntervalNs) } };
}

/** A host byte table: framed keys and values (see `frame`). */
export class Bytes {
  constructor(table) {
    this.table = table;
  }

  /** Declares a table from a full spec (only in `init`). */
  static declare(spec) {
    return new Bytes(stateCall("declare", () => declare(spec)));
  }

  /** Byte values per flow, keyed by the batch's flow index (framed as 4
   * bytes little-endian); only in `init`. `options.capacity` counts one
   * worker's flows; with `options.notifyExpired`, entries idle for
   * `options.idleTimeoutNs` of packet time reach the NF's `expired` (keys:
   * 37-byte flow keys). */
  static perFlow(name, maxValueSize, options = {}) {
    return Bytes.declare(spec(name, "per-flow", "bytes", { tag: "local" }, maxValueSize, options));
  }

  /** A global byte table with one owner worker per key (only in `init`):
   * writes to keys another worker owns are forwarded to it, and the last
   * applied write wins (an empty value removes); reads see the owner's
   * value as published at its last sync plus this worker's own writes
   * since. `keySize` 0 allows keys of 1 to 256 bytes; owners sync every
   * `syncIntervalNs` of packet time (0: every batch). `options.capacity`
   * counts the whole table, over every worker. */
  static singleWriter(name, keySize, maxValueSize, syncIntervalNs = 0n, options = {}) {
    return Bytes.declare(spec(name, "global", "bytes", singleWriter(syncIntervalNs), maxValueSize, options, "read-write", keySize));
  }

  /** Global byte values written in `init` (with `putMany`) and replicated
   * to every worker; `process` only reads them (only in `init`). `keySize`
   * 0 allows keys of 1 to 256 bytes. */
  static readOnly(name, keySize, maxValueSize, options = {}) {
    return Bytes.declare(spec(name, "global", "bytes", { tag: "local" }, maxValueSize, options, "read-only", keySize));
  }

  /** Reads values: `keys` framed, the result framed in the same order (an
   * empty item for an absent key). */
  getMany(keys) {
    return stateCall("get-many", () => getMany(this.table, keys));
  }

  /** Writes framed key, value, key, value, ... (an empty value removes the
   * key). A StateError `full`, `over-budget`, `too-large` or `bad-input`
   * carries the index of the key-value entry it stopped at (`item`);
   * entries before it were written. */
  putMany(entries) {
    stateCall("put-many", () => putMany(this.table, entries));
  }

  /** One page of the table in ascending key order (bytewise): `{ entries,
   * cursor }`, up to `limit` `[key, value]` Uint8Array pairs after
   * `cursor` (empty: from the start; `limit` 0 or above 1024: 1024) and
   * the cursor of the next page (empty: done). Per-flow tables refuse it
   * (`wrong-kind`). */
  scan(cursor = NO_CURSOR, limit = 0) {
    const page = scanPage("scan", this.table, cursor, limit);
    return { entries: pairs(page.entries), cursor: page.cursor };
  }

  /** Every `[key, value]` of the table in ascending key order, page by
   * page. */
  *entries(limit = 0) {
    yield* walk(this, limit);
  }
}

/** A release table: integer resources shared by the host's workers, each
 * bound to a value while held. */
export class Pool {
  constructor(table) {
    this.table = table;
  }

  /** The resources `first .. first + count`, each bound to a value of up
   * to `maxValueSize` bytes while held; a worker takes `chunk` of them
   * from the free list at a time (0: the host chooses). Only in `init`.
   * Pools hold at most `count` bindings and never expire. */
  static declare(name, first, count, maxValueSize, chunk = 0) {
    const consistency = { tag: "release", val: { first: BigInt(first), count: BigInt(count), chunk } };
    return new Pool(stateCall("declare", () => declare(spec(name, "global", "bytes", consistency, maxValueSize))));
  }

  /** Resources (bigint) bound to the framed values, in order; fewer than
   * asked when the whole pool is used up. A StateError `too-large` or
   * `bad-input` carries the index of the value (`item`). */
  acquire(values) {
    return stateCall("acquire", () => acquire(this.table, values));
  }

  /** The values bound to resources, framed in order (empty: not held). */
  lookup(resources) {
    return stateCall("lookup", () => lookup(this.table, bigints(resources, false)));
  }

  /** Gives resources back (one not held is ignored). */
  release(resources) {
    stateCall("release", () => release(this.table, bigints(resources, false)));
  }

  /** One page of the resources held on every worker, ascending: `{
   * entries, cursor }`, up to `limit` `[resource, value]` pairs (a bigint
   * and a Uint8Array) after `cursor` (empty: from the start; `limit` 0 or
   * above 1024: 1024) and the cursor of the next page (empty: done). */
  scan(cursor = NO_CURSOR, limit = 0) {
    const page = scanPage("scan", this.table, cursor, limit);
    return {
      entries: pairs(page.entries).map(([k, v]) => [new DataView(k.buffer, k.byteOffset, 8).getBigUint64(0, true), v]),
      cursor: page.cursor,
    };
  }

  /** Every held `[resource, value]`, ascending, page by page. */
  *entries(limit = 0) {
    yield* walk(this, limit);
  }
}

function message(e) {
  return e instanceof Error ? `${e.name}: ${e.message}` : String(e);
}

/** The component's `nf` export for the NF class `NfClass`:
 * `export const nf = exportNf(MyNf)`. */
export function exportNf(NfClass) {
  let nf;
  return {
    init(config) {
      let info;
      try {
        const created = new NfClass();
        info = created.init(config);
        nf = created;
      } catch (e) {
        throw e instanceof Error ? e.message : String(e);
      }
      return info ?? stateless();
    },
    process(frame) {
      if (!nf) throw "process called before a successful init";
      let batch;
      try {
        batch = new Batch(frame);
      } catch (e) {
        throw message(e);
      }
      try {
        nf.process(batch);
        return batch.finish();
      } catch (e) {
        batch.flushEvents();
        throw message(e);
      }
    },
    expired(table, entries) {
      if (!nf || !nf.expired) return;
      try {
        nf.expired(table, entries);
      } catch (e) {
        throw message(e);
      }
    },
  };
}
