// Types of @sluice/nf: write Sluice network functions in JavaScript.

export type Level = "debug" | "info" | "warn" | "error";

export interface NfInfo {
  wantsFlowState: boolean;
  flowIdleTimeoutNs: bigint;
}

export const DROP: 0;
export const NO_FLOW: 0xffff;
export const NO_L4: 0xffff;
export const NO_L3: 0xff;
export const FLAG_REVERSE: 1;
export const FLAG_FRAGMENT: 2;
export const FLAG_TRUNCATED: 4;
export const FLAG_IPV6: 8;
export const TCP_FIN: 0x01;
export const TCP_SYN: 0x02;
export const TCP_RST: 0x04;
export const TCP_ACK: 0x10;

/** Verdict: forward out of `port` (0: the default output). */
export function forward(port?: number): number;
/** Verdict: send to the chain branch selected by `value`. */
export function label(value: number): number;
export function stateless(): NfInfo;
export function withFlowState(idleTimeoutNs?: bigint | number): NfInfo;
export function log(level: Level, message: string): void;
/** Sends events now, in one call, outside a batch (e.g. from `expired`). */
export function emit(events: Array<{ kind: string; level: Level; fields: Array<[string, string]> }>): void;
/** The value of `key` in a config of `key=value` lines. */
export function configValue(config: Uint8Array, key: string): string | undefined;
/** The value of `key`, or `def` when absent. */
export function configString(config: Uint8Array, key: string, def?: string): string;
/** Decimal digits with an optional sign, within ±(2^53 - 1), or `def` when
 * absent; throws `"<key> = <value>: not an integer"` otherwise. */
export function configInt(config: Uint8Array, key: string, def?: number): number;
/** A decimal number (`1.5`, `.5`, `2e-3`), or `def` when absent; throws
 * `"<key> = <value>: not a number"` otherwise. */
export function configFloat(config: Uint8Array, key: string, def?: number): number;
/** true/false, yes/no, on/off, 1/0 in any case, or `def` when absent;
 * throws `"<key> = <value>: not a boolean ..."` otherwise. */
export function configBool(config: Uint8Array, key: string, def?: boolean): boolean;
/** `a.b.c.d[/n]` as [network, mask], unsigned 32-bit numbers. */
export function parseIpv4Cidr(text: string): [number, number];
/** RFC 1624 incremental checksum update. */
export function csumUpdate16(checksum: number, oldWord: number, newWord: number): number;

export class Packet {
  readonly index: number;
  readonly data: Uint8Array;
  readonly wireLen: number;
  /** Index of the packet's flow in the batch, or NO_FLOW. */
  readonly flow: number;
  readonly ingressPort: number;
  readonly l4Offset: number;
  readonly l3Offset: number;
  readonly flags: number;
  readonly timestampNs: bigint;
  readonly flowHash: bigint;
  isIpv4(): boolean;
  ipProto(): number;
  ipv4Src(): number;
  ipv4Dst(): number;
  /** An IPv6 packet whose fixed 40-byte header was captured. */
  isIpv6(): boolean;
  /** The 16 bytes of the IPv6 source address, undefined if not IPv6. */
  ipv6Src(): Uint8Array | undefined;
  /** The 16 bytes of the IPv6 destination address, undefined if not IPv6. */
  ipv6Dst(): Uint8Array | undefined;
  isTcp(): boolean;
  isUdp(): boolean;
  srcPort(): number;
  dstPort(): number;
  tcpFlags(): number;
}

export class Batch {
  readonly length: number;
  packet(i: number): Packet;
  packets(): IterableIterator<Packet>;
  setVerdict(i: number, verdict: number): void;
  flowState(flow: number): Uint8Array | undefined;
  setFlowState(flow: number, state: Uint8Array | ArrayLike<number>): void;
  removeFlowState(flow: number): void;
  rewrite(i: number, data: Uint8Array | ArrayLike<number>): void;
  emit(kind: string, level: Level, packet: number | undefined, fields: Array<[string, string]>): void;
  /** Offloads packet `i`'s flow (sluice:nf@0.5.0): later packets in its
   * direction get its verdict and `rewrites` without a call. */
  offload(i: number, options?: OffloadOptions): void;
  /** What passed under this NF's entries that ended since the last batch. */
  offloadReturns(): OffloadReturn[];
}

/** A change an offload entry makes to each later packet. */
export type RewriteOp =
  | { tag: "source"; val: { address: Uint8Array; port: number | undefined } }
  | { tag: "destination"; val: { address: Uint8Array; port: number | undefined } }
  | { tag: "decrement-ttl" }
  | { tag: "set-dscp"; val: number };

export interface OffloadOptions {
  /** At most 8 changes. */
  rewrites?: RewriteOp[];
  /** End after this long without a packet (0: the NF's flow idle timeout). */
  idleTimeoutNs?: bigint | number;
  /** End after this many packets, bytes or this long (0: no limit). */
  maxPackets?: bigint | number;
  maxBytes?: bigint | number;
  maxAgeNs?: bigint | number;
  /** Hand back what passed under the entry when it ends (default true). */
  counts?: boolean;
}

export type EndReason = "closed" | "limit" | "idle" | "revoked" | "replaced";

export interface OffloadReturn {
  /** The flow's index in this batch when a packet of it is here. */
  flow: number | undefined;
  flowHash: bigint;
  key: Uint8Array;
  reverse: boolean;
  packets: bigint;
  bytes: bigint;
  reason: EndReason;
}

export function setSource(address: ArrayLike<number>, port?: number): RewriteOp;
export function setDestination(address: ArrayLike<number>, port?: number): RewriteOp;
export function decrementTtl(): RewriteOp;
export function setDscp(dscp: number): RewriteOp;

export type OffloadErrorKind = "not-now" | "bad-packet" | "not-offloadable" | "bad-rewrite" | "over-budget";

/** Why the host made no entry for an offload request. */
export class OffloadError extends Error {
  readonly kind: OffloadErrorKind;
  readonly detail: string | undefined;
}

/** Sends the batch's offload requests now: undefined where an entry was made. */
export function offloadNow(batch: Batch): Array<OffloadError | undefined>;

/** Which flow directions have proved long enough to offload: counts of
 * each direction's packets in the instance's memory (`slots` flows, four
 * ways per hash). `admit(p)` is true once p's direction has carried `after`
 * counted packets (0 and 1: at once). */
export class Admission {
  constructor(after: number, slots?: number);
  readonly after: number;
  admit(p: Packet): boolean;
  /** Forgets the counts of p's flow (a new connection on its 5-tuple). */
  forget(p: Packet): void;
}

/** Ends this worker's entries of these flows (both directions) after the batch. */
export function revoke(flowHashes: ArrayLike<bigint | number>): void;
/** Ends every entry of this NF on this worker after the batch. */
export function revokeAll(): void;
/** The entries that ended since the last call. */
export function offloadReturned(): OffloadReturn[];

/** The contract's state-error cases. */
export type StateErrorKind =
  | "unknown-table"
  | "not-now"
  | "wrong-kind"
  | "bad-spec"
  | "incompatible"
  | "bad-input"
  | "full"
  | "over-budget"
  | "too-large";

/** A failed host table operation. */
export class StateError extends Error {
  /** The call: "declare", "counter-add", "put-many", ... */
  readonly op: string;
  readonly kind: StateErrorKind;
  /** bad-input, full, over-budget, too-large: the index of the refused item
   * (the items before it were applied). */
  readonly item: number | undefined;
  /** bad-spec, incompatible: the host's reason. */
  readonly detail: string | undefined;
}

export type Merge = "sum" | "max" | "min";

/** What every table helper takes last. */
export interface TableOptions {
  /** Most entries (0: the host's default, 65536). */
  capacity?: number;
  /** Entries idle this long (packet time) are removed (0: never). */
  idleTimeoutNs?: bigint | number;
  /** Hand removed entries to the NF's `expired`. */
  notifyExpired?: boolean;
}

export class Counters {
  readonly table: number;
  static declare(spec: object): Counters;
  static sum(name: string, mergeIntervalNs?: bigint | number, options?: TableOptions): Counters;
  /** Eventual counters merged with `merge` (see the README). */
  static eventual(name: string, merge?: Merge, mergeIntervalNs?: bigint | number, options?: TableOptions): Counters;
  /** Single-writer counters: one owner worker per key (see the README). */
  static singleWriter(name: string, syncIntervalNs?: bigint | number, options?: TableOptions): Counters;
  /** Counters per flow, keyed by the batch's flow index. */
  static perFlow(name: string, options?: TableOptions): Counters;
  /** Global counters written in `init`, replicated to every worker. */
  static readOnly(name: string, options?: TableOptions): Counters;
  add(keys: ArrayLike<number | bigint>, deltas: ArrayLike<number | bigint>): void;
  get(keys: ArrayLike<number | bigint>): BigUint64Array;
  /** One page in ascending key order, after `cursor` (empty: the start); `limit` 0 or above 1024: 1024. */
  scan(cursor?: Uint8Array, limit?: number): ScanPage<[bigint, bigint]>;
  /** Every `[key, value]` in ascending key order, page by page. */
  entries(limit?: number): Generator<[bigint, bigint]>;
  /** The `k` (at most 1024) largest counters, largest first, ties by ascending key. */
  topK(k: number): [bigint, bigint][];
}

/** The most entries one `scan` page and one `topK` hold (the host's bound). */
export const SCAN_MAX: number;

/** One page of a table scan: its entries in ascending key order, and the
 * cursor of the next page (empty when the scan is done). */
export interface ScanPage<T> {
  entries: T[];
  cursor: Uint8Array;
}

/** Frames items for the state interface (4-byte LE length + bytes each). */
export function frame(items: Uint8Array[]): Uint8Array;
/** The items of a framed list. */
export function unframe(data: Uint8Array): Uint8Array[];

export class Bytes {
  readonly table: number;
  static declare(spec: object): Bytes;
  static perFlow(name: string, maxValueSize: number, options?: TableOptions): Bytes;
  /** Single-writer byte values: one owner worker per key (see the README). */
  static singleWriter(
    name: string,
    keySize: number,
    maxValueSize: number,
    syncIntervalNs?: bigint | number,
    options?: TableOptions,
  ): Bytes;
  /** Global byte values written in `init`, replicated to every worker. */
  static readOnly(name: string, keySize: number, maxValueSize: number, options?: TableOptions): Bytes;
  getMany(keys: Uint8Array): Uint8Array;
  putMany(entries: Uint8Array): void;
  /** One page in ascending (bytewise) key order, after `cursor` (empty: the start). */
  scan(cursor?: Uint8Array, limit?: number): ScanPage<[Uint8Array, Uint8Array]>;
  /** Every `[key, value]` in ascending key order, page by page. */
  entries(limit?: number): Generator<[Uint8Array, Uint8Array]>;
}

export class Pool {
  readonly table: number;
  static declare(name: string, first: number | bigint, count: number | bigint, maxValueSize: number, chunk?: number): Pool;
  acquire(values: Uint8Array): BigUint64Array;
  lookup(resources: ArrayLike<number | bigint>): Uint8Array;
  release(resources: ArrayLike<number | bigint>): void;
  /** One page of the held resources (every worker's), ascending, after `cursor` (empty: the start). */
  scan(cursor?: Uint8Array, limit?: number): ScanPage<[bigint, Uint8Array]>;
  /** Every held `[resource, value]`, ascending, page by page. */
  entries(limit?: number): Generator<[bigint, Uint8Array]>;
}

export interface NetworkFunction {
  init(config: Uint8Array): NfInfo | undefined;
  process(batch: Batch): void;
  expired?(table: number, entries: Uint8Array): void;
}

/** The component's `nf` export: `export const nf = exportNf(MyNf)`. */
export function exportNf(nfClass: new () => NetworkFunction): {
  init(config: Uint8Array): NfInfo;
  process(batch: unknown): unknown;
  expired(table: number, entries: Uint8Array): void;
};
