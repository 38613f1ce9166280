//go:build wasip1

// The canonical-ABI glue between the component model and Go: the exports
// of sluice:nf/nf@0.6.0, the imports of host-log, state and offload, and the
// realloc functions the host allocates guest memory with. Layouts follow the component model's canonical ABI for
// the records of wit/v0.6.0/nf.wit (offsets are noted where they are not
// obvious); the build embeds the contract's component type, and
// wit-component checks every signature here against it.

package nf

import "unsafe"

// The host may not be called while it is lowering arguments into the
// guest (cabi_realloc runs with leaving the instance forbidden), and Go's
// allocator may call the host (clocks, scheduling) whenever it decides to
// collect. So cabi_realloc never allocates: it hands out pieces of an
// arena, which is emptied when an export call ends and grown, between
// calls, to twice the largest call seen. The host holds only offsets into
// it, which Go's collector does not need to see.
//
// 4 MiB holds a batch of 256 jumbo frames. A larger call falls back to
// Go's allocator, which may trap (the host then re-creates the instance
// and applies the failure policy) — so the arena starts big enough for
// any batch the host sends by default.
var (
	arena     = make([]uint64, 1<<19)
	arenaUsed uintptr
	arenaPeak uintptr
	// overflow keeps an allocation that did not fit the arena alive until
	// the call ends.
	overflow [][]uint64
)

// lastResult keeps the previous export's result alive until the host has
// read it (the next export call replaces it).
var lastResult []any

//go:wasmexport cabi_export_realloc
func cabiExportRealloc(oldPtr unsafe.Pointer, oldSize, align, newSize uint32) unsafe.Pointer {
	return cabiRealloc(oldPtr, oldSize, align, newSize)
}

//go:wasmexport cabi_import_realloc
func cabiImportRealloc(oldPtr unsafe.Pointer, oldSize, align, newSize uint32) unsafe.Pointer {
	return cabiRealloc(oldPtr, oldSize, align, newSize)
}

func cabiRealloc(oldPtr unsafe.Pointer, oldSize, align, newSize uint32) unsafe.Pointer {
	if newSize == 0 {
		return unsafe.Pointer(uintptr(align))
	}
	size := (uintptr(newSize) + 7) &^ 7
	var p unsafe.Pointer
	if arenaUsed+size <= uintptr(len(arena))*8 {
		p = unsafe.Add(unsafe.Pointer(&arena[0]), arenaUsed)
		arenaUsed += size
		arenaPeak = max(arenaPeak, arenaUsed)
	} else {
		buf := make([]uint64, size/8)
		overflow = append(overflow, buf)
		p = unsafe.Pointer(&buf[0])
		arenaPeak = max(arenaPeak, arenaUsed+size)
	}
	if oldPtr != nil && oldSize > 0 {
		copy(unsafe.Slice((*byte)(p), newSize), unsafe.Slice((*byte)(oldPtr), min(oldSize, newSize)))
	}
	return p
}

// endCall empties the arena once an export call no longer needs its
// arguments, and grows it (allowed here, outside cabi_realloc) when the
// call came close to filling it.
func endCall() {
	arenaUsed = 0
	overflow = nil
	if arenaPeak*2 > uintptr(len(arena))*8 {
		arena = make([]uint64, arenaPeak*2/8+1)
	}
	arenaPeak = 0
}

func bytesAt(ptr, n uint32) []byte {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), n)
}

func u64sAt(ptr, n uint32) []uint64 {
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*uint64)(unsafe.Pointer(uintptr(ptr))), n)
}

func ptrOf[T any](s []T) uint32 {
	if len(s) == 0 {
		return 0
	}
	return uint32(uintptr(unsafe.Pointer(&s[0])))
}

func strPtr(s string) (uint32, uint32) {
	if len(s) == 0 {
		return 0, 0
	}
	return uint32(uintptr(unsafe.Pointer(unsafe.StringData(s)))), uint32(len(s))
}

// retArea returns an 8-byte-aligned scratch area of n bytes for a result,
// kept alive with the call's result.
func retArea(n int) ([]byte, uint32) {
	buf := make([]uint64, (n+7)/8)
	lastResult = append(lastResult, buf)
	b := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), n)
	return b, uint32(uintptr(unsafe.Pointer(&buf[0])))
}

func put32(b []byte, at int, v uint32) {
	b[at], b[at+1], b[at+2], b[at+3] = byte(v), byte(v>>8), byte(v>>16), byte(v>>24)
}

func put64(b []byte, at int, v uint64) {
	put32(b, at, uint32(v))
	put32(b, at+4, uint32(v>>32))
}

func get32(b []byte, at int) uint32 {
	return uint32(b[at]) | uint32(b[at+1])<<8 | uint32(b[at+2])<<16 | uint32(b[at+3])<<24
}

func get64(b []byte, at int) uint64 {
	return uint64(get32(b, at)) | uint64(get32(b, at+4))<<32
}

// errResult writes `err(message)` for the result types whose payload
// starts at offset `at` (a string: pointer, length).
func errResult(area []byte, at int, message string) {
	msg := []byte(message)
	lastResult = append(lastResult, msg)
	area[0] = 1
	put32(area, at, ptrOf(msg))
	put32(area, at+4, uint32(len(msg)))
}

// ---- exports -------------------------------------------------------------

// init: func(config: list<u8>) -> result<nf-info, string>
// Return area (24 bytes): tag @0; ok: wants-flow-state @8, idle ns @16;
// err: string @8.
//
//go:wasmexport sluice:nf/nf@0.6.0#init
func exportInit(ptr, n uint32) uint32 {
	defer endCall()
	lastResult = nil
	area, ret := retArea(24)
	info, err := callInit(append([]byte(nil), bytesAt(ptr, n)...))
	if err != nil {
		errResult(area, 8, err.Error())
		return ret
	}
	if info.WantsFlowState {
		area[8] = 1
	}
	put64(area, 16, info.FlowIdleTimeoutNs)
	return ret
}

// process: func(batch: list<u8>) -> result<batch-result, string>
// The batch is one frame (packet bytes, padding to 8, descriptors, flow
// states, a 16-byte trailer; see splitFrame). Return area (28 bytes): tag
// @0; ok: verdicts @4, rewrites @12, flow-updates @20 (pointer, length
// each); err: string @4.
//
//go:wasmexport sluice:nf/nf@0.6.0#process
func exportProcess(ptr, n uint32) uint32 {
	defer endCall()
	lastResult = nil
	area, ret := retArea(28)
	frame := bytesAt(ptr, n)
	parts, ferr := splitFrame(frame)
	if ferr != nil {
		errResult(area, 4, ferr.Error())
		return ret
	}
	// The descriptors start at a multiple of 8 of an allocation of
	// cabi_realloc's (8-aligned): read in place.
	desc := u64sAt(ptr+uint32(parts.descAt), uint32(4*parts.packets))
	b := newBatch(frame[:parts.data], desc, frame[parts.statesAt:parts.statesEnd])
	err := callProcess(b)
	b.flushEvents()
	if err == nil {
		b.flushOffloads()
	}
	if err != nil {
		errResult(area, 4, err.Error())
		return ret
	}
	lastResult = append(lastResult, b.verdicts)
	put32(area, 4, ptrOf(b.verdicts))
	put32(area, 8, uint32(len(b.verdicts)))
	// rewrite: packet @0, data @4 (12 bytes)
	rw := make([]byte, 12*len(b.rewrites))
	for i, r := range b.rewrites {
		lastResult = append(lastResult, r.data)
		put32(rw, 12*i, r.packet)
		put32(rw, 12*i+4, ptrOf(r.data))
		put32(rw, 12*i+8, uint32(len(r.data)))
	}
	rwAligned := alignedCopy(rw)
	put32(area, 12, ptrOf(rwAligned))
	put32(area, 16, uint32(len(b.rewrites)))
	// flow-update: flow @0, op tag @4, set bytes @8 (16 bytes)
	var ups []byte
	count := 0
	for flow, op := range b.pending {
		if op == keep {
			continue
		}
		u := make([]byte, 16)
		put32(u, 0, uint32(flow))
		if op == set {
			s := b.newStates[flow]
			lastResult = append(lastResult, s)
			put32(u, 8, ptrOf(s))
			put32(u, 12, uint32(len(s)))
		} else {
			u[4] = 1
		}
		ups = append(ups, u...)
		count++
	}
	upsAligned := alignedCopy(ups)
	put32(area, 20, ptrOf(upsAligned))
	put32(area, 24, uint32(count))
	return ret
}

// expired: func(table: table, entries: list<u8>) -> result<_, string>
// Return area (12 bytes): tag @0, err string @4.
//
//go:wasmexport sluice:nf/nf@0.6.0#expired
func exportExpired(table, ptr, n uint32) uint32 {
	defer endCall()
	lastResult = nil
	area, ret := retArea(12)
	err := callExpired(table, append([]byte(nil), bytesAt(ptr, n)...))
	if err != nil {
		errResult(area, 4, err.Error())
	}
	return ret
}

// alignedCopy copies b into 8-byte-aligned memory kept with the result.
func alignedCopy(b []byte) []byte {
	if len(b) == 0 {
		return nil
	}
	buf := make([]uint64, (len(b)+7)/8)
	lastResult = append(lastResult, buf)
	out := unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), len(b))
	copy(out, b)
	return out
}

// ---- imports ---------------------------------------------------------------

//go:wasmimport sluice:nf/host-log@0.6.0 log
func hostLog(level, msgPtr, msgLen uint32)

//go:wasmimport sluice:nf/host-log@0.6.0 emit
func hostEmit(ptr, n uint32)

//go:wasmimport sluice:nf/state@0.6.0 declare
func stateDeclare(namePtr, nameLen, scope, access, kind, consTag uint32, cons1, cons2 uint64, cons3, keySize, maxValue, capacity uint32, idle uint64, notify, ret uint32)

//go:wasmimport sluice:nf/state@0.6.0 counter-add
func stateCounterAdd(table, keysPtr, keysLen, deltasPtr, deltasLen, ret uint32)

//go:wasmimport sluice:nf/state@0.6.0 counter-get
func stateCounterGet(table, keysPtr, keysLen, ret uint32)

//go:wasmimport sluice:nf/state@0.6.0 get-many
func stateGetMany(table, keysPtr, keysLen, ret uint32)

//go:wasmimport sluice:nf/state@0.6.0 put-many
func statePutMany(table, entriesPtr, entriesLen, ret uint32)

//go:wasmimport sluice:nf/state@0.6.0 acquire
func stateAcquire(table, valuesPtr, valuesLen, ret uint32)

//go:wasmimport sluice:nf/state@0.6.0 lookup
func stateLookup(table, idsPtr, idsLen, ret uint32)

//go:wasmimport sluice:nf/state@0.6.0 release
func stateRelease(table, idsPtr, idsLen, ret uint32)

// scan: func(table, cursor: list<u8>, limit: u32) -> result<scan-page, state-error>
// Return area (28 bytes): tag @0; ok: counters @4, entries @12, cursor
// @20 (pointer, length each; a counter pair is 16 bytes: key @0, value
// @8); err: state-error tag @4, payload @8.
//
//go:wasmimport sluice:nf/state@0.6.0 scan
func stateScan(table, cursorPtr, cursorLen, limit, ret uint32)

// top-k: func(table, k: u32) -> result<list<tuple<u64, u64>>, state-error>
// Return area (16 bytes): tag @0; ok: pairs @4 (pointer, length).
//
//go:wasmimport sluice:nf/state@0.6.0 top-k
func stateTopK(table, k, ret uint32)

// scratch is an 8-byte-aligned return area for an import call.
func scratch(n int) ([]uint64, []byte, uint32) {
	buf := make([]uint64, (n+7)/8)
	return buf, unsafe.Slice((*byte)(unsafe.Pointer(&buf[0])), n), uint32(uintptr(unsafe.Pointer(&buf[0])))
}

// stateResult reads a result<T, state-error> return area (16 bytes: tag
// @0; ok payload @4; err: state-error tag @4, payload @8).
func stateResult(area []byte, what string) error {
	if area[0] == 0 {
		return nil
	}
	tag := area[4]
	e := &StateError{Op: what, Kind: stateErrorNames[min(int(tag), len(stateErrorNames)-1)]}
	switch tag {
	case 3, 4: // bad-spec, incompatible: a string
		e.Detail = string(bytesAt(get32(area, 8), get32(area, 12)))
	case 0, 5, 6, 7, 8: // a table handle or an item index
		e.Index = get32(area, 8)
	}
	return e
}

var stateErrorNames = []string{"unknown-table", "not-now", "wrong-kind", "bad-spec", "incompatible", "bad-input", "full", "over-budget", "too-large", "unknown"}
