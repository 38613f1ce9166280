//go:build wasip1

package nf

import (
	"fmt"
	"runtime"
)

// StateError is a failed host table operation. Nothing traps: the NF
// decides what the failure means for its batch.
type StateError struct {
	// Op is the call: "declare", "counter-add", "put-many", ...
	Op string
	// Kind is the contract's state-error case: "unknown-table", "not-now",
	// "wrong-kind", "bad-spec", "incompatible", "bad-input", "full",
	// "over-budget" or "too-large".
	Kind string
	// Index is, for bad-input, full, over-budget and too-large, the index
	// of the item the call stopped at (see Item); for unknown-table, the
	// table handle; 0 otherwise.
	Index uint32
	// Detail is the host's reason for bad-spec and incompatible.
	Detail string
}

func (e *StateError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("%s: %s: %s", e.Op, e.Kind, e.Detail)
	}
	if i, ok := e.Item(); ok {
		return fmt.Sprintf("%s: %s at item %d", e.Op, e.Kind, i)
	}
	if e.Kind == "unknown-table" {
		return fmt.Sprintf("%s: %s %d", e.Op, e.Kind, e.Index)
	}
	return fmt.Sprintf("%s: %s", e.Op, e.Kind)
}

// Item is the index of the item a batched call stopped at, for bad-input,
// full, over-budget and too-large: the key of Counters.Add, the key-value
// entry of Bytes.PutMany, the value of Pool.Acquire. The items before it
// were applied; it and the ones after it were not. ok is false for the
// other kinds.
func (e *StateError) Item() (index uint32, ok bool) {
	switch e.Kind {
	case "bad-input", "full", "over-budget", "too-large":
		return e.Index, true
	}
	return 0, false
}

// Scopes, accesses, kinds and merges of a TableSpec.
const (
	PerFlow uint32 = 0
	Global  uint32 = 1

	ReadOnly  uint32 = 0
	ReadWrite uint32 = 1

	CounterKind uint32 = 0
	BytesKind   uint32 = 1

	MergeSum uint32 = 0
	MergeMax uint32 = 1
	MergeMin uint32 = 2
)

// TableSpec declares a table (see the state interface of the contract).
// Consistency: Eventual set for eventual tables, Pool for release tables,
// SingleWriter for single-writer tables, none of them for local ones.
type TableSpec struct {
	Name                string
	Scope, Access, Kind uint32
	Eventual            *EventualSpec
	Pool                *PoolSpec
	SingleWriter        *SingleWriterSpec
	KeySize, MaxValue   uint32
	Capacity            uint32
	IdleTimeoutNs       uint64
	NotifyExpired       bool
}

// EventualSpec: how the replicas of an eventual table merge.
type EventualSpec struct {
	Merge           uint32
	MergeIntervalNs uint64
}

// PoolSpec: the resources of a release table.
type PoolSpec struct {
	First, Count uint64
	Chunk        uint32
}

// SingleWriterSpec: how often the owners of a single-writer table's keys
// apply the writes forwarded to them and publish their keys.
type SingleWriterSpec struct {
	SyncIntervalNs uint64
}

// TableOption sets a field of the spec a table helper declares:
// WithCapacity, WithIdleTimeout, WithNotifyExpired, WithChunk.
type TableOption func(*TableSpec)

// WithCapacity sets the most entries the table holds (0: the host's
// default, 65536). Per-flow and read-only tables count one worker's
// entries; eventual and single-writer tables the whole table over every
// worker; a pool holds at most its count bindings, and a capacity below
// the count is refused.
func WithCapacity(n uint32) TableOption { return func(s *TableSpec) { s.Capacity = n } }

// WithIdleTimeout removes an entry neither written nor read for ns of
// packet time (0: never); for per-flow tables, the flow's idle time. Pools
// refuse it.
func WithIdleTimeout(ns uint64) TableOption { return func(s *TableSpec) { s.IdleTimeoutNs = ns } }

// WithNotifyExpired hands the entries removed for idleness to the NF's
// Expired (per-flow keys as 37-byte flow keys, counters as 8-byte
// little-endian keys and values).
func WithNotifyExpired() TableOption { return func(s *TableSpec) { s.NotifyExpired = true } }

// WithChunk sets how many resources a pool's worker takes from the free
// list at a time (0: the host chooses); other tables ignore it.
func WithChunk(n uint32) TableOption {
	return func(s *TableSpec) {
		if s.Pool != nil {
			s.Pool.Chunk = n
		}
	}
}

// declareWith declares spec after applying opts.
func declareWith(spec TableSpec, opts []TableOption) (uint32, error) {
	for _, o := range opts {
		o(&spec)
	}
	return Declare(spec)
}

// Declare declares a table (only in Init) and returns its handle, or finds
// the one this NF declared earlier under the same name. Errors: not-now
// outside Init, bad-spec for an invalid spec, incompatible when the name
// exists with another scope, access, kind or consistency.
//
// The consistency variant is lowered flat, as the canonical ABI flattens
// it: its discriminant, then the join of its cases' flattenings (i64, i64,
// i32: pool-spec's first, count and chunk; eventual-spec's merge and
// interval and single-writer-spec's interval fill the leading i64s).
func Declare(spec TableSpec) (uint32, error) {
	tag, c1, c2, c3 := uint32(0), uint64(0), uint64(0), uint32(0)
	switch {
	case spec.Eventual != nil:
		tag, c1, c2 = 1, uint64(spec.Eventual.Merge), spec.Eventual.MergeIntervalNs
	case spec.Pool != nil:
		tag, c1, c2, c3 = 2, spec.Pool.First, spec.Pool.Count, spec.Pool.Chunk
	case spec.SingleWriter != nil:
		tag, c1 = 3, spec.SingleWriter.SyncIntervalNs
	}
	notify := uint32(0)
	if spec.NotifyExpired {
		notify = 1
	}
	buf, area, ret := scratch(16)
	np, nn := strPtr(spec.Name)
	stateDeclare(np, nn, spec.Scope, spec.Access, spec.Kind, tag, c1, c2, c3, spec.KeySize, spec.MaxValue,
		spec.Capacity, spec.IdleTimeoutNs, notify, ret)
	runtime.KeepAlive(spec.Name)
	if err := stateResult(area, "declare"); err != nil {
		return 0, err
	}
	t := get32(area, 4)
	runtime.KeepAlive(buf)
	return t, nil
}

// stateCall makes one state import call with a result area and reads the
// result's error side; the area (ok payload at offset 4) comes back for
// the caller to read. The closure keeps the call's arguments alive.
func stateCall(what string, call func(ret uint32)) ([]byte, error) {
	return stateCallN(what, 16, call)
}

// stateCallN is stateCall with an n-byte result area.
func stateCallN(what string, n int, call func(ret uint32)) ([]byte, error) {
	_, area, ret := scratch(n)
	call(ret)
	return area, stateResult(area, what)
}

// ScanMax is the most entries one Scan page and one TopK hold (the host's
// bound on limit and k).
const ScanMax = 1024

// CounterEntry is one counter of a table: its key and value.
type CounterEntry struct {
	Key, Value uint64
}

// BytesEntry is one entry of a byte table, or one held resource of a pool
// (Key: its 8 bytes little-endian).
type BytesEntry struct {
	Key, Value []byte
}

// scanRaw makes one scan call: the counter pairs, the framed entries and
// the next cursor, copied out of the host's result.
func scanRaw(table uint32, cursor []byte, limit uint32) ([]CounterEntry, []byte, []byte, error) {
	area, err := stateCallN("scan", 28, func(ret uint32) {
		stateScan(table, ptrOf(cursor), uint32(len(cursor)), limit, ret)
		runtime.KeepAlive(cursor)
	})
	if err != nil {
		return nil, nil, nil, err
	}
	return counterPairs(get32(area, 4), get32(area, 8)),
		append([]byte(nil), bytesAt(get32(area, 12), get32(area, 16))...),
		append([]byte(nil), bytesAt(get32(area, 20), get32(area, 24))...), nil
}

// counterPairs copies a list<tuple<u64, u64>> (16 bytes per pair).
func counterPairs(ptr, n uint32) []CounterEntry {
	raw := u64sAt(ptr, 2*n)
	out := make([]CounterEntry, n)
	for i := range out {
		out[i] = CounterEntry{raw[2*i], raw[2*i+1]}
	}
	return out
}

// bytesPairs splits framed key, value, key, value, ... into entries.
func bytesPairs(framed []byte) ([]BytesEntry, error) {
	items, err := Unframe(framed)
	if err != nil {
		return nil, err
	}
	out := make([]BytesEntry, 0, len(items)/2)
	for i := 0; i+1 < len(items); i += 2 {
		out = append(out, BytesEntry{items[i], items[i+1]})
	}
	return out, nil
}

// Scan returns one page of the table in ascending key order: up to limit
// counters whose key comes after cursor (nil: from the start; limit 0 or
// above ScanMax: ScanMax), and the cursor of the next page (empty: the
// scan is done). Per-flow tables refuse it (wrong-kind). It costs one
// state operation per entry plus one per call.
func (c Counters) Scan(cursor []byte, limit uint32) ([]CounterEntry, []byte, error) {
	pairs, _, next, err := scanRaw(c.Table, cursor, limit)
	return pairs, next, err
}

// All returns every counter of the table in ascending key order, reading
// it one Scan page of limit entries at a time.
func (c Counters) All(limit uint32) ([]CounterEntry, error) {
	return allPages(func(cursor []byte) ([]CounterEntry, []byte, error) { return c.Scan(cursor, limit) })
}

// TopK returns the k largest counters (k at most ScanMax), largest first,
// equal values by ascending key, selected by the host without reading
// every key. It costs one state operation per entry plus one.
func (c Counters) TopK(k uint32) ([]CounterEntry, error) {
	area, err := stateCall("top-k", func(ret uint32) { stateTopK(c.Table, k, ret) })
	if err != nil {
		return nil, err
	}
	return counterPairs(get32(area, 4), get32(area, 8)), nil
}

// Counters is a host counter table.
type Counters struct{ Table uint32 }

// SumCounters declares a global counter table whose workers' replicas are
// summed every mergeIntervalNs of packet time (only in Init): the same as
// EventualCounters(name, MergeSum, mergeIntervalNs, opts...).
func SumCounters(name string, mergeIntervalNs uint64, opts ...TableOption) (Counters, error) {
	return EventualCounters(name, MergeSum, mergeIntervalNs, opts...)
}

// EventualCounters declares a global counter table, one replica per
// worker, merged with merge (MergeSum, MergeMax: the largest value wins,
// MergeMin) every mergeIntervalNs of packet time (0: every batch); only in
// Init. For max and min tables, Add offers its delta as a candidate value.
// WithCapacity counts the whole table, over every worker.
func EventualCounters(name string, merge uint32, mergeIntervalNs uint64, opts ...TableOption) (Counters, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: CounterKind,
		Eventual: &EventualSpec{Merge: merge, MergeIntervalNs: mergeIntervalNs}, MaxValue: 8}, opts)
	return Counters{t}, err
}

// SingleWriterCounters declares a global counter table with one owner
// worker per key (only in Init): adds to keys another worker owns are
// forwarded to it as deltas, so none is lost; reads see the owner's value
// as published at its last sync plus this worker's own adds since. Owners
// sync every syncIntervalNs of packet time (0: every batch). WithCapacity
// counts the whole table, over every worker.
func SingleWriterCounters(name string, syncIntervalNs uint64, opts ...TableOption) (Counters, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: CounterKind,
		SingleWriter: &SingleWriterSpec{SyncIntervalNs: syncIntervalNs}, MaxValue: 8}, opts)
	return Counters{t}, err
}

// PerFlowCounters declares counters per flow, keyed by the batch's flow
// index (only in Init). WithCapacity counts one worker's flows.
func PerFlowCounters(name string, opts ...TableOption) (Counters, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: PerFlow, Access: ReadWrite, Kind: CounterKind, MaxValue: 8}, opts)
	return Counters{t}, err
}

// ReadOnlyCounters declares global counters written in Init (with Add)
// and replicated to every worker; Process only reads them (only in Init).
func ReadOnlyCounters(name string, opts ...TableOption) (Counters, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: Global, Access: ReadOnly, Kind: CounterKind, MaxValue: 8}, opts)
	return Counters{t}, err
}

// Add adds deltas[i] to the counter keys[i] (for max/min eventual tables:
// offers the value). A full, over-budget or bad-input *StateError carries
// the index of the key it stopped at (Item); keys before it were added.
func (c Counters) Add(keys []uint64, deltas []int64) error {
	_, err := stateCall("counter-add", func(ret uint32) {
		stateCounterAdd(c.Table, ptrOf(keys), uint32(len(keys)), ptrOf(deltas), uint32(len(deltas)), ret)
	})
	return err
}

// Get reads counters (0 for absent keys).
func (c Counters) Get(keys []uint64) ([]uint64, error) {
	area, err := stateCall("counter-get", func(ret uint32) { stateCounterGet(c.Table, ptrOf(keys), uint32(len(keys)), ret) })
	if err != nil {
		return nil, err
	}
	return append([]uint64(nil), u64sAt(get32(area, 4), get32(area, 8))...), nil
}

// Bytes is a host byte table.
type Bytes struct{ Table uint32 }

// GetMany reads values: keys framed (4-byte little-endian length, bytes),
// the result framed in the same order.
func (t Bytes) GetMany(keys []byte) ([]byte, error) {
	area, err := stateCall("get-many", func(ret uint32) { stateGetMany(t.Table, ptrOf(keys), uint32(len(keys)), ret) })
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), bytesAt(get32(area, 4), get32(area, 8))...), nil
}

// PutMany writes framed key, value, key, value, ... (an empty value
// removes the key). A full, over-budget, too-large or bad-input
// *StateError carries the index of the key-value entry it stopped at
// (Item); entries before it were written.
func (t Bytes) PutMany(entries []byte) error {
	_, err := stateCall("put-many", func(ret uint32) { statePutMany(t.Table, ptrOf(entries), uint32(len(entries)), ret) })
	return err
}

// Scan returns one page of the table in ascending (bytewise) key order:
// up to limit entries whose key comes after cursor (nil: from the start;
// limit 0 or above ScanMax: ScanMax), and the cursor of the next page
// (empty: the scan is done). Per-flow tables refuse it (wrong-kind).
func (t Bytes) Scan(cursor []byte, limit uint32) ([]BytesEntry, []byte, error) {
	_, framed, next, err := scanRaw(t.Table, cursor, limit)
	if err != nil {
		return nil, nil, err
	}
	entries, err := bytesPairs(framed)
	return entries, next, err
}

// All returns every entry of the table in ascending key order, reading it
// one Scan page of limit entries at a time.
func (t Bytes) All(limit uint32) ([]BytesEntry, error) {
	return allPages(func(cursor []byte) ([]BytesEntry, []byte, error) { return t.Scan(cursor, limit) })
}

// allPages calls scan from an empty cursor, then from each page's next
// cursor until it is empty, and returns the pages' entries in order (with
// those read before an error).
func allPages[T any](scan func(cursor []byte) ([]T, []byte, error)) ([]T, error) {
	var all []T
	var cursor []byte
	for {
		page, next, err := scan(cursor)
		if err != nil {
			return all, err
		}
		all = append(all, page...)
		if len(next) == 0 {
			return all, nil
		}
		cursor = next
	}
}

// PerFlowBytes declares byte values per flow, keyed by the batch's flow
// index framed as 4 bytes little-endian (only in Init). WithCapacity
// counts one worker's flows.
func PerFlowBytes(name string, maxValueSize uint32, opts ...TableOption) (Bytes, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: PerFlow, Access: ReadWrite, Kind: BytesKind,
		MaxValue: maxValueSize}, opts)
	return Bytes{t}, err
}

// PerFlowBytesExpiring is PerFlowBytes with an idle timeout (packet time);
// with notifyExpired, expired entries reach the NF's Expired (keys: the
// 37-byte flow keys). The same as PerFlowBytes with WithIdleTimeout and
// WithNotifyExpired.
func PerFlowBytesExpiring(name string, maxValueSize uint32, idleTimeoutNs uint64, notifyExpired bool, opts ...TableOption) (Bytes, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: PerFlow, Access: ReadWrite, Kind: BytesKind, MaxValue: maxValueSize,
		IdleTimeoutNs: idleTimeoutNs, NotifyExpired: notifyExpired}, opts)
	return Bytes{t}, err
}

// ReadOnlyBytes declares global byte values written in Init (with
// PutMany) and replicated to every worker; Process only reads them (only
// in Init). keySize 0 allows keys of 1 to 256 bytes.
func ReadOnlyBytes(name string, keySize, maxValueSize uint32, opts ...TableOption) (Bytes, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: Global, Access: ReadOnly, Kind: BytesKind, KeySize: keySize,
		MaxValue: maxValueSize}, opts)
	return Bytes{t}, err
}

// SingleWriterBytes declares a global byte table with one owner worker
// per key (only in Init): writes to keys another worker owns are forwarded
// to it, and the last applied write wins (an empty value removes); reads
// see the owner's value as published at its last sync plus this worker's
// own writes since. keySize 0 allows keys of 1 to 256 bytes; owners sync
// every syncIntervalNs of packet time (0: every batch). WithCapacity
// counts the whole table, over every worker.
func SingleWriterBytes(name string, keySize, maxValueSize uint32, syncIntervalNs uint64, opts ...TableOption) (Bytes, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: BytesKind,
		SingleWriter: &SingleWriterSpec{SyncIntervalNs: syncIntervalNs}, KeySize: keySize, MaxValue: maxValueSize}, opts)
	return Bytes{t}, err
}

// Pool is a release table: integer resources shared by the host's
// workers, each bound to a value while held.
type Pool struct{ Table uint32 }

// DeclarePool declares the resources first .. first+count, each bound to
// a value of up to maxValueSize bytes while held (only in Init). WithChunk
// sets how many a worker takes at a time; pools hold at most count
// bindings and take no idle timeout.
func DeclarePool(name string, first, count uint64, maxValueSize uint32, opts ...TableOption) (Pool, error) {
	t, err := declareWith(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: BytesKind,
		Pool: &PoolSpec{First: first, Count: count}, MaxValue: maxValueSize}, opts)
	return Pool{t}, err
}

// Acquire takes one resource per framed value, bound to it; fewer than
// asked when the pool is exhausted. A too-large or bad-input *StateError
// carries the index of the value (Item).
func (p Pool) Acquire(values []byte) ([]uint64, error) {
	area, err := stateCall("acquire", func(ret uint32) { stateAcquire(p.Table, ptrOf(values), uint32(len(values)), ret) })
	if err != nil {
		return nil, err
	}
	return append([]uint64(nil), u64sAt(get32(area, 4), get32(area, 8))...), nil
}

// Lookup returns the values bound to resources, framed in order.
func (p Pool) Lookup(ids []uint64) ([]byte, error) {
	area, err := stateCall("lookup", func(ret uint32) { stateLookup(p.Table, ptrOf(ids), uint32(len(ids)), ret) })
	if err != nil {
		return nil, err
	}
	return append([]byte(nil), bytesAt(get32(area, 4), get32(area, 8))...), nil
}

// Release gives resources back (one not held is ignored).
func (p Pool) Release(ids []uint64) error {
	_, err := stateCall("release", func(ret uint32) { stateRelease(p.Table, ptrOf(ids), uint32(len(ids)), ret) })
	return err
}

// Scan returns one page of the resources held on every worker, ascending:
// up to limit entries (Key: the resource, 8 bytes little-endian; Value:
// its bound value) after cursor (nil: from the start), and the cursor of
// the next page (empty: the scan is done).
func (p Pool) Scan(cursor []byte, limit uint32) ([]BytesEntry, []byte, error) {
	_, framed, next, err := scanRaw(p.Table, cursor, limit)
	if err != nil {
		return nil, nil, err
	}
	entries, err := bytesPairs(framed)
	return entries, next, err
}

// Unframe splits a framed list into its items.
func Unframe(data []byte) ([][]byte, error) {
	var items [][]byte
	for at := 0; at < len(data); {
		if at+4 > len(data) {
			return nil, fmt.Errorf("framing cut short at byte %d", at)
		}
		n := int(get32(data, at))
		if n > len(data)-at-4 {
			return nil, fmt.Errorf("framing cut short at byte %d", at)
		}
		items = append(items, data[at+4:at+4+n])
		at += 4 + n
	}
	return items, nil
}

// PushFrame appends one framed item to a key or entry list.
func PushFrame(out []byte, item []byte) []byte {
	n := uint32(len(item))
	out = append(out, byte(n), byte(n>>8), byte(n>>16), byte(n>>24))
	return append(out, item...)
}
