//go:build wasip1

package nf

import (
	"fmt"
	"runtime"
)

// StateError is a failed host table operation.
type StateError struct {
	Op     string
	Kind   string
	Index  uint32
	Detail string
}

func (e *StateError) Error() string {
	if e.Detail != "" {
		return fmt.Sprintf("%s: %s: %s", e.Op, e.Kind, e.Detail)
	}
	return fmt.Sprintf("%s: %s (%d)", e.Op, e.Kind, e.Index)
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

// Declare declares a table (only in Init) and returns its handle.
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
	_, area, ret := scratch(16)
	call(ret)
	return area, stateResult(area, what)
}

// Counters is a host counter table.
type Counters struct{ Table uint32 }

// SumCounters declares a global counter table whose workers' replicas are
// summed every mergeIntervalNs of packet time (only in Init).
func SumCounters(name string, mergeIntervalNs uint64) (Counters, error) {
	t, err := Declare(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: CounterKind,
		Eventual: &EventualSpec{Merge: MergeSum, MergeIntervalNs: mergeIntervalNs}, MaxValue: 8})
	return Counters{t}, err
}

// SingleWriterCounters declares a global counter table with one owner
// worker per key (only in Init): adds to keys another worker owns are
// forwarded to it as deltas, so none is lost; reads see the owner's value
// as published at its last sync plus this worker's own adds since. Owners
// sync every syncIntervalNs of packet time (0: every batch).
func SingleWriterCounters(name string, syncIntervalNs uint64) (Counters, error) {
	t, err := Declare(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: CounterKind,
		SingleWriter: &SingleWriterSpec{SyncIntervalNs: syncIntervalNs}, MaxValue: 8})
	return Counters{t}, err
}

// Add adds deltas[i] to the counter keys[i].
func (c Counters) Add(keys []uint64, deltas []int64) error {
	_, err := stateCall("counter-add", func(ret uint32) {
		stateCounterAdd(c.Table, ptrOf(keys), uint32(len(keys)), ptrOf(deltas), uint32(len(deltas)), ret)
	})
	return err
}

// Get reads counters.
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
// removes the key).
func (t Bytes) PutMany(entries []byte) error {
	_, err := stateCall("put-many", func(ret uint32) { statePutMany(t.Table, ptrOf(entries), uint32(len(entries)), ret) })
	return err
}

// PerFlowBytes declares byte values per flow, keyed by the batch's flow
// index framed as 4 bytes little-endian (only in Init).
func PerFlowBytes(name string, maxValueSize uint32) (Bytes, error) {
	return PerFlowBytesExpiring(name, maxValueSize, 0, false)
}

// PerFlowBytesExpiring is PerFlowBytes with an idle timeout (packet time);
// with notifyExpired, expired entries reach the NF's Expired (keys: the
// 37-byte flow keys).
func PerFlowBytesExpiring(name string, maxValueSize uint32, idleTimeoutNs uint64, notifyExpired bool) (Bytes, error) {
	t, err := Declare(TableSpec{Name: name, Scope: PerFlow, Access: ReadWrite, Kind: BytesKind, MaxValue: maxValueSize,
		IdleTimeoutNs: idleTimeoutNs, NotifyExpired: notifyExpired})
	return Bytes{t}, err
}

// SingleWriterBytes declares a global byte table with one owner worker
// per key (only in Init): writes to keys another worker owns are forwarded
// to it, and the last applied write wins (an empty value removes); reads
// see the owner's value as published at its last sync plus this worker's
// own writes since. keySize 0 allows keys of 1 to 256 bytes; owners sync
// every syncIntervalNs of packet time (0: every batch).
func SingleWriterBytes(name string, keySize, maxValueSize uint32, syncIntervalNs uint64) (Bytes, error) {
	t, err := Declare(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: BytesKind,
		SingleWriter: &SingleWriterSpec{SyncIntervalNs: syncIntervalNs}, KeySize: keySize, MaxValue: maxValueSize})
	return Bytes{t}, err
}

// Pool is a release table: integer resources shared by the host's
// workers, each bound to a value while held.
type Pool struct{ Table uint32 }

// DeclarePool declares the resources first .. first+count, each bound to
// a value of up to maxValueSize bytes while held (only in Init).
func DeclarePool(name string, first, count uint64, maxValueSize uint32) (Pool, error) {
	t, err := Declare(TableSpec{Name: name, Scope: Global, Access: ReadWrite, Kind: BytesKind,
		Pool: &PoolSpec{First: first, Count: count}, MaxValue: maxValueSize})
	return Pool{t}, err
}

// Acquire takes one resource per framed value, bound to it; fewer than
// asked when the pool is exhausted.
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

// Release gives resources back.
func (p Pool) Release(ids []uint64) error {
	_, err := stateCall("release", func(ret uint32) { stateRelease(p.Table, ptrOf(ids), uint32(len(ids)), ret) })
	return err
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
