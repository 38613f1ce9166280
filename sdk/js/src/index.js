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
// The contract is wit/v0.3.0/nf.wit (sluice:nf@0.3.0); componentize-js
// provides the `sluice:nf/*` imports when it builds the NF.

import { emit as hostEmit, log as hostLog } from "sluice:nf/host-log@0.3.0";
import { acquire, counterAdd, counterGet, declare, getMany, lookup, putMany, release } from "sluice:nf/state@0.3.0";

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

function be16(d, at) {
  return (d[at] << 8) | d[at + 1];
}

function be32(d, at) {
  return ((d[at] << 24) | (d[at + 1] << 16) | (d[at + 2] << 8) | d[at + 3]) >>> 0;
}

/** One packet of a batch: its bytes and what the host parsed out of them. */
export class Packet {
  constructor(batch, i, data, lo0, hi0, lo3, hi3) {
    this.batch = batch;
    this.index = i;
    this.data = data;
    this.wireLen = hi0;
    this.flow = lo3 & 0xffff;
    this.ingressPort = lo3 >>> 16;
    this.l4Offset = hi3 & 0xffff;
    this.l3Offset = (hi3 >>> 16) & 0xff;
    this.flags = hi3 >>> 24;
    this._v4 = undefined;
    this._proto = undefined;
    this._tcp = undefined;
  }

  /** Arrival time, ns since the Unix epoch (bigint). */
  get timestampNs() {
    return this.batch.descriptors[4 * this.index + 1];
  }

  /** Symmetric flow hash (bigint; 0n without a flow). */
  get flowHash() {
    return this.batch.descriptors[4 * this.index + 2];
  }

  /** An IPv4 packet whose whole IP header was captured. */
  isIpv4() {
    // Memoized: the engine inside the component interprets, so the
    // accessors that build on this one should not repeat its checks.
    if (this._v4 === undefined) {
      const l3 = this.l3Offset, d = this.data;
      if (l3 === NO_L3 || this.flags & FLAG_IPV6 || l3 + 20 > d.length || d[l3] >> 4 !== 4) {
        this._v4 = false;
      } else {
        const hl = (d[l3] & 0x0f) * 4;
        this._v4 = hl >= 20 && l3 + hl <= d.length && be16(d, l3 + 2) >= hl;
      }
    }
    return this._v4;
  }

  /** The IP protocol (for IPv6 the first next header); 0 if not IP. */
  ipProto() {
    if (this._proto === undefined) {
      if (this.l3Offset === NO_L3) this._proto = 0;
      else if (!(this.flags & FLAG_IPV6)) this._proto = this.isIpv4() ? this.data[this.l3Offset + 9] : 0;
      else {
        const at = this.l3Offset + 6;
        this._proto = at < this.data.length ? this.data[at] : 0;
      }
    }
    return this._proto;
  }

  ipv4Src() {
    return this.isIpv4() ? be32(this.data, this.l3Offset + 12) : 0;
  }

  ipv4Dst() {
    return this.isIpv4() ? be32(this.data, this.l3Offset + 16) : 0;
  }

  /** A TCP packet whose whole TCP header was captured. */
  isTcp() {
    if (this._tcp === undefined) {
      const l4 = this.l4Offset, d = this.data;
      if (l4 === NO_L4 || this.ipProto() !== 6 || l4 + 20 > d.length) this._tcp = false;
      else {
        const hl = (d[l4 + 12] >> 4) * 4;
        this._tcp = hl >= 20 && l4 + hl <= d.length;
      }
    }
    return this._tcp;
  }

  /** A UDP packet whose UDP header was captured. */
  isUdp() {
    return this.l4Offset !== NO_L4 && this.ipProto() === 17 && this.l4Offset + 8 <= this.data.length;
  }

  srcPort() {
    return this.isTcp() || this.isUdp() ? be16(this.data, this.l4Offset) : 0;
  }

  dstPort() {
    return this.isTcp() || this.isUdp() ? be16(this.data, this.l4Offset + 2) : 0;
  }

  /** TCP flags byte, 0 if not TCP. */
  tcpFlags() {
    return this.isTcp() ? this.data[this.l4Offset + 13] : 0;
  }
}

const KEEP = 0, SET = 1, REMOVE = 2;

/** A batch of packets with their flow state, plus the NF's decisions.
 * Every packet starts with the verdict `forward(0)`. */
export class Batch {
  constructor(raw) {
    this.data = raw.data;
    this.descriptors = raw.descriptors;
    // The descriptors as 32-bit halves (little-endian), so the hot fields
    // are read without BigInt arithmetic.
    this.words = new Uint32Array(raw.descriptors.buffer, raw.descriptors.byteOffset, raw.descriptors.length * 2);
    this.length = raw.descriptors.length >>> 2;
    this.verdicts = new Uint32Array(this.length).fill(forward(0));
    this.rewrites = new Map();
    this.events = [];
    const s = raw.flowStates;
    this.states = [];
    for (let at = 0; at + 4 <= s.length; ) {
      const len = (s[at] | (s[at + 1] << 8) | (s[at + 2] << 16) | (s[at + 3] << 24)) >>> 0;
      if (len > s.length - at - 4) break;
      this.states.push(s.subarray(at + 4, at + 4 + len));
      at += 4 + len;
    }
    this.pending = new Uint8Array(this.states.length);
    this.newStates = new Array(this.states.length);
  }

  /** Packet `i` (0 <= i < length). */
  packet(i) {
    const w = this.words, b = 8 * i;
    const start = i ? w[b - 8] : 0;
    return new Packet(this, i, this.data.subarray(start, w[b]), w[b], w[b + 1], w[b + 6], w[b + 7]);
  }

  /** All packets in order. */
  *packets() {
    for (let i = 0; i < this.length; i++) yield this.packet(i);
  }

  setVerdict(i, verdict) {
    if (i >= 0 && i < this.length) this.verdicts[i] = verdict;
  }

  /** The state of `flow` as of now, or undefined if it has none. */
  flowState(flow) {
    if (flow >= this.states.length) return undefined;
    switch (this.pending[flow]) {
      case SET:
        return this.newStates[flow];
      case REMOVE:
        return undefined;
      default:
        return this.states[flow].length ? this.states[flow] : undefined;
    }
  }

  /** Stores `state` (1..4096 bytes) for `flow`. */
  setFlowState(flow, state) {
    if (flow >= this.states.length) return;
    if (!state.length) return this.removeFlowState(flow);
    this.pending[flow] = SET;
    this.newStates[flow] = Uint8Array.from(state);
  }

  /** Forgets the state of `flow`. */
  removeFlowState(flow) {
    if (flow >= this.states.length) return;
    this.pending[flow] = REMOVE;
    this.newStates[flow] = undefined;
  }

  /** Replaces the bytes of packet `i`. */
  rewrite(i, data) {
    if (i >= 0 && i < this.length) this.rewrites.set(i, Uint8Array.from(data));
  }

  /** Queues an event; a batch's events reach the host in one call. */
  emit(kind, level, packet, fields) {
    this.events.push({ kind, level, packet: packet ?? undefined, fields: fields.map(([k, v]) => [k, v]) });
  }

  finish() {
    if (this.events.length) hostEmit(this.events);
    const rewrites = [...this.rewrites.entries()].sort((a, b) => a[0] - b[0]).map(([packet, data]) => ({ packet, data }));
    const flowUpdates = [];
    for (let flow = 0; flow < this.pending.length; flow++) {
      if (this.pending[flow] === SET) flowUpdates.push({ flow, op: { tag: "set", val: this.newStates[flow] } });
      else if (this.pending[flow] === REMOVE) flowUpdates.push({ flow, op: { tag: "remove" } });
    }
    return { verdicts: this.verdicts, rewrites, flowUpdates };
  }
}

/** A host table operation failed. */
export class StateError extends Error {}

function stateCall(what, f) {
  try {
    return f();
  } catch (e) {
    const p = e && e.payload !== undefined ? e.payload : e;
    throw new StateError(`${what}: ${p && p.tag ? p.tag + (p.val !== undefined ? " " + p.val : "") : String(p)}`);
  }
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
   * `mergeIntervalNs` of packet time (only in `init`). */
  static sum(name, mergeIntervalNs = 0n) {
    return Counters.declare({
      name,
      scope: "global",
      access: "read-write",
      kind: "counter",
      consistency: { tag: "eventual", val: { merge: "sum", mergeIntervalNs: BigInt(mergeIntervalNs) } },
      keySize: 0,
      maxValueSize: 8,
      capacity: 0,
      idleTimeoutNs: 0n,
      notifyExpired: false,
    });
  }

  /** A global counter table with one owner worker per key (only in
   * `init`): adds to keys another worker owns are forwarded to it as
   * deltas, so none is lost; reads see the owner's value as published at
   * its last sync plus this worker's own adds since. Owners sync every
   * `syncIntervalNs` of packet time (0: every batch). */
  static singleWriter(name, syncIntervalNs = 0n) {
    return Counters.declare(spec(name, "global", "counter", singleWriter(syncIntervalNs), 8));
  }

  add(keys, deltas) {
    const k = BigUint64Array.from(keys, BigInt);
    const d = BigInt64Array.from(deltas, BigInt);
    stateCall("counter-add", () => counterAdd(this.table, k, d));
  }

  get(keys) {
    return stateCall("counter-get", () => counterGet(this.table, BigUint64Array.from(keys, BigInt)));
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
    items.push(data.subarray(at + 4, at + 4 + n));
    at += 4 + n;
  }
  return items;
}

function spec(name, scope, kind, consistency, maxValueSize, idleTimeoutNs = 0n, notifyExpired = false, keySize = 0) {
  return {
    name,
    scope,
    access: "read-write",
    kind,
    consistency,
    keySize,
    maxValueSize,
    capacity: 0,
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

  static declare(spec) {
    return new Bytes(stateCall("declare", () => declare(spec)));
  }

  /** Byte values per flow, keyed by the batch's flow index (framed as 4
   * bytes little-endian); only in `init`. With `notifyExpired`, entries
   * idle for `idleTimeoutNs` of packet time reach the NF's `expired` (keys:
   * 37-byte flow keys). */
  static perFlow(name, maxValueSize, { idleTimeoutNs = 0n, notifyExpired = false } = {}) {
    return Bytes.declare(spec(name, "per-flow", "bytes", { tag: "local" }, maxValueSize, idleTimeoutNs, notifyExpired));
  }

  /** A global byte table with one owner worker per key (only in `init`):
   * writes to keys another worker owns are forwarded to it, and the last
   * applied write wins (an empty value removes); reads see the owner's
   * value as published at its last sync plus this worker's own writes
   * since. `keySize` 0 allows keys of 1 to 256 bytes; owners sync every
   * `syncIntervalNs` of packet time (0: every batch). */
  static singleWriter(name, keySize, maxValueSize, syncIntervalNs = 0n) {
    return Bytes.declare(spec(name, "global", "bytes", singleWriter(syncIntervalNs), maxValueSize, 0n, false, keySize));
  }

  getMany(keys) {
    return stateCall("get-many", () => getMany(this.table, keys));
  }

  putMany(entries) {
    stateCall("put-many", () => putMany(this.table, entries));
  }
}

/** A release table: integer resources shared by the host's workers, each
 * bound to a value while held. */
export class Pool {
  constructor(table) {
    this.table = table;
  }

  /** The resources `first .. first + count` (only in `init`). */
  static declare(name, first, count, maxValueSize, chunk = 0) {
    const consistency = { tag: "release", val: { first: BigInt(first), count: BigInt(count), chunk } };
    return new Pool(stateCall("declare", () => declare(spec(name, "global", "bytes", consistency, maxValueSize))));
  }

  /** Resources (bigint) bound to the framed values, in order. */
  acquire(values) {
    return stateCall("acquire", () => acquire(this.table, values));
  }

  lookup(resources) {
    return stateCall("lookup", () => lookup(this.table, BigUint64Array.from(resources, BigInt)));
  }

  release(resources) {
    stateCall("release", () => release(this.table, BigUint64Array.from(resources, BigInt)));
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
    process(raw) {
      if (!nf) throw "process called before a successful init";
      const batch = new Batch(raw);
      try {
        nf.process(batch);
      } catch (e) {
        throw message(e);
      }
      return batch.finish();
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
