//go:build wasip1

package nf

import (
	"errors"
	"runtime"
	"strconv"
	"unsafe"
)

// Descriptor constants of the contract.
const (
	NoFlow       = 0xffff
	NoL4         = 0xffff
	NoL3         = 0xff
	FlagReverse  = 1
	FlagFragment = 2
	FlagTrunc    = 4
	FlagIPv6     = 8
	TCPFin       = 0x01
	TCPSyn       = 0x02
	TCPRst       = 0x04
	TCPAck       = 0x10
)

type pendingOp uint8

const (
	keep pendingOp = iota
	set
	remove
)

type rewrite struct {
	packet uint32
	data   []byte
}

type event struct {
	kind   string
	level  uint8
	packet int64
	fields [][2]string
}

// Batch is one batch of packets with their flow state, plus the NF's
// decisions. Every packet starts with the verdict Forward(0).
type Batch struct {
	data      []byte
	desc      []uint64
	verdicts  []uint32
	states    [][]byte
	pending   []pendingOp
	newStates [][]byte
	rewrites  []rewrite
	rewritten map[uint32]int
	events    []event
	// offload requests, sent when Process returns, and the returns of
	// ended entries, taken at most once per batch
	offloads     []Offload
	returns      []OffloadReturn
	returnsTaken bool
}

// frameParts says where the parts of a batch frame (sluice:nf@0.6.0
// process) are: bytes 0..data the packets, descAt.. 32 bytes a packet the
// descriptors, statesAt..statesEnd the flow states.
type frameParts struct {
	data, descAt, packets, statesAt, statesEnd int
}

// splitFrame reads a batch frame's 16-byte trailer (packets, data bytes,
// flow-state bytes, reserved; little-endian u32s) and checks it against
// the frame's length.
func splitFrame(frame []byte) (frameParts, error) {
	size := len(frame)
	if size < 16 {
		return frameParts{}, errors.New("batch frame of " + strconv.Itoa(size) + " bytes: shorter than its 16-byte trailer")
	}
	n, data, states := uint64(get32(frame, size-16)), uint64(get32(frame, size-12)), uint64(get32(frame, size-8))
	descAt := (data + 7) &^ 7
	statesAt := descAt + 32*n
	if statesAt+states+16 != uint64(size) {
		return frameParts{}, errors.New("batch frame of " + strconv.Itoa(size) + " bytes: its trailer says " +
			strconv.FormatUint(n, 10) + " packets, " + strconv.FormatUint(data, 10) + " data bytes, " +
			strconv.FormatUint(states, 10) + " flow-state bytes")
	}
	return frameParts{int(data), int(descAt), int(n), int(statesAt), int(statesAt + states)}, nil
}

func newBatch(data []byte, desc []uint64, flowStates []byte) *Batch {
	n := len(desc) / 4
	b := &Batch{data: data, desc: desc, verdicts: make([]uint32, n)}
	for i := range b.verdicts {
		b.verdicts[i] = Forward(0)
	}
	for at := 0; at+4 <= len(flowStates); {
		l := int(get32(flowStates, at))
		if l > len(flowStates)-at-4 {
			break
		}
		b.states = append(b.states, flowStates[at+4:at+4+l])
		at += 4 + l
	}
	b.pending = make([]pendingOp, len(b.states))
	b.newStates = make([][]byte, len(b.states))
	return b
}

// Len is the number of packets.
func (b *Batch) Len() int { return len(b.verdicts) }

// Packet returns packet i (0 <= i < Len()).
func (b *Batch) Packet(i int) Packet {
	w := b.desc[4*i : 4*i+4]
	start := uint32(0)
	if i > 0 {
		start = uint32(b.desc[4*i-4])
	}
	end := uint32(w[0])
	var data []byte
	if start <= end && int(end) <= len(b.data) {
		data = b.data[start:end]
	}
	return Packet{
		Data:        data,
		WireLen:     uint32(w[0] >> 32),
		TimestampNs: w[1],
		FlowHash:    w[2],
		Flow:        uint32(w[3] & 0xffff),
		IngressPort: uint16(w[3] >> 16),
		L4Offset:    uint16(w[3] >> 32),
		L3Offset:    uint8(w[3] >> 48),
		Flags:       uint8(w[3] >> 56),
	}
}

// SetVerdict sets the verdict of packet i.
func (b *Batch) SetVerdict(i int, v uint32) {
	if i >= 0 && i < len(b.verdicts) {
		b.verdicts[i] = v
	}
}

// FlowState is the state of flow as of now, or nil if it has none.
func (b *Batch) FlowState(flow uint32) []byte {
	if int(flow) >= len(b.states) {
		return nil
	}
	switch b.pending[flow] {
	case set:
		return b.newStates[flow]
	case remove:
		return nil
	}
	if len(b.states[flow]) == 0 {
		return nil
	}
	return b.states[flow]
}

// SetFlowState stores state (1..4096 bytes) for flow.
func (b *Batch) SetFlowState(flow uint32, state []byte) {
	if int(flow) >= len(b.states) {
		return
	}
	if len(state) == 0 {
		b.RemoveFlowState(flow)
		return
	}
	b.pending[flow] = set
	b.newStates[flow] = append([]byte(nil), state...)
}

// RemoveFlowState forgets the state of flow.
func (b *Batch) RemoveFlowState(flow uint32) {
	if int(flow) < len(b.states) {
		b.pending[flow] = remove
		b.newStates[flow] = nil
	}
}

// Rewrite replaces the bytes of packet i.
func (b *Batch) Rewrite(i int, data []byte) {
	if i < 0 || i >= len(b.verdicts) {
		return
	}
	if b.rewritten == nil {
		b.rewritten = map[uint32]int{}
	}
	d := append([]byte(nil), data...)
	if k, ok := b.rewritten[uint32(i)]; ok {
		b.rewrites[k].data = d
		return
	}
	b.rewritten[uint32(i)] = len(b.rewrites)
	b.rewrites = append(b.rewrites, rewrite{uint32(i), d})
}

// Emit queues an event (packet -1: none); a batch's events reach the host
// in one call.
func (b *Batch) Emit(kind string, level uint8, packet int, fields ...[2]string) {
	b.events = append(b.events, event{kind, level, int64(packet), fields})
}

// flushEvents sends the queued events as one list<event>: each event is
// 28 bytes (kind @0, level @8, packet option @12/@16, fields @20), each
// field a tuple of two strings (16 bytes).
func (b *Batch) flushEvents() {
	emitEvents(b.events)
	b.events = nil
}

// Emit sends events now, in one call, outside a batch (e.g. from
// Expired): each a kind, level and fields.
func Emit(events ...Event) {
	evs := make([]event, len(events))
	for i, e := range events {
		evs[i] = event{e.Kind, e.Level, -1, e.Fields}
	}
	emitEvents(evs)
}

// Event is an event sent with Emit.
type Event struct {
	Kind   string
	Level  uint8
	Fields [][2]string
}

func emitEvents(events []event) {
	if len(events) == 0 {
		return
	}
	b := struct{ events []event }{events}
	alive := make([]any, 0, len(b.events))
	evs := make([]uint64, (28*len(b.events)+7)/8)
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&evs[0])), 28*len(b.events))
	for i, e := range b.events {
		at := 28 * i
		kp, kn := strPtr(e.kind)
		put32(mem, at, kp)
		put32(mem, at+4, kn)
		mem[at+8] = e.level
		if e.packet >= 0 {
			mem[at+12] = 1
			put32(mem, at+16, uint32(e.packet))
		}
		if len(e.fields) > 0 {
			fs := make([]uint64, 2*len(e.fields))
			fm := unsafe.Slice((*byte)(unsafe.Pointer(&fs[0])), 16*len(e.fields))
			for j, f := range e.fields {
				a, an := strPtr(f[0])
				v, vn := strPtr(f[1])
				put32(fm, 16*j, a)
				put32(fm, 16*j+4, an)
				put32(fm, 16*j+8, v)
				put32(fm, 16*j+12, vn)
			}
			alive = append(alive, fs)
			put32(mem, at+20, ptrOf(fs))
			put32(mem, at+24, uint32(len(e.fields)))
		}
	}
	hostEmit(ptrOf(evs), uint32(len(b.events)))
	runtime.KeepAlive(alive)
	runtime.KeepAlive(evs)
}
