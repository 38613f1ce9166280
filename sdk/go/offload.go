//go:build wasip1

package nf

import (
	"runtime"
	"unsafe"
)

// Flow offload (sluice:nf@0.5.0 `offload`): once the NF has decided a
// flow, the host gives the flow's later packets the same verdict and
// header changes itself, without calling the NF.
//
// Offload a packet with Batch.Offload: its flow, in its direction and from
// its ingress port, gets this packet's verdict from now on, plus the
// changes listed (the packet itself is changed only by what the batch
// rewrites, as usual). Offload each direction with a packet that travels
// it. An entry ends, and that packet comes to the NF, on a TCP FIN or RST,
// at its packet or byte limit, or when a TTL is too low to lower; it also
// ends when idle, revoked or when the NF is replaced. What passed under it
// comes back with a later batch (Batch.OffloadReturns), so counters the NF
// keeps can end equal to a run without offload.
//
// A chain skips its NFs for a packet only where every NF it went through
// offloaded it in the same batch. An NF that must see every packet (an
// IDS, a rate limiter) does not offload. Each entry is charged 256 bytes
// against the NF's state budget.

// Offload is a request to offload the flow of one packet of the batch.
type Offload struct {
	// The packet (its index in the batch).
	Packet int
	// Changes later packets get (at most 8): SetSource, SetDestination,
	// DecrementTTL, SetDSCP.
	Rewrites []RewriteOp
	// End the entry after this long without a packet (packet time); 0: the
	// NF's flow idle timeout.
	IdleTimeoutNs uint64
	// End the entry after this many packets, bytes or this long after it
	// was made (0: no limit).
	MaxPackets, MaxBytes, MaxAgeNs uint64
	// Ask for nothing back when the entry ends (an NF that counts nothing
	// per packet, e.g. a firewall); by default what passed under the entry
	// comes back through Batch.OffloadReturns.
	WithoutCounts bool
}

// RewriteOp is one change an offload entry makes to each later packet.
type RewriteOp struct {
	tag     uint8
	address []byte
	port    uint16
	hasPort bool
	dscp    uint8
}

// SetSource gives later packets this sender address (4 or 16 bytes) and,
// for TCP and UDP, port (port < 0: the port stays).
func SetSource(address []byte, port int) RewriteOp {
	return RewriteOp{tag: 0, address: append([]byte(nil), address...), port: uint16(port), hasPort: port >= 0 && port <= 0xffff}
}

// SetDestination gives later packets this receiver address and port
// (port < 0: the port stays).
func SetDestination(address []byte, port int) RewriteOp {
	return RewriteOp{tag: 1, address: append([]byte(nil), address...), port: uint16(port), hasPort: port >= 0 && port <= 0xffff}
}

// DecrementTTL lowers later packets' TTL or hop limit by one.
func DecrementTTL() RewriteOp { return RewriteOp{tag: 2} }

// SetDSCP gives later packets this DSCP (0 to 63).
func SetDSCP(dscp uint8) RewriteOp { return RewriteOp{tag: 3, dscp: dscp} }

// OffloadError is why the host made no entry for a request: Kind is
// "not-now", "bad-packet", "not-offloadable", "bad-rewrite" or
// "over-budget"; Detail says more for the two that carry text.
type OffloadError struct {
	Kind   string
	Detail string
}

func (e *OffloadError) Error() string {
	if e.Detail != "" {
		return "offload: " + e.Kind + ": " + e.Detail
	}
	return "offload: " + e.Kind
}

var offloadErrorNames = []string{"not-now", "bad-packet", "not-offloadable", "bad-rewrite", "over-budget", "unknown"}

// EndReason is why an entry ended.
type EndReason uint8

const (
	// A TCP FIN or RST came (that packet went to the NF).
	EndClosed EndReason = iota
	// A packet, byte or age limit, or a TTL too low to lower.
	EndLimit
	// The flow was idle for the entry's timeout.
	EndIdle
	// Revoke or RevokeAll.
	EndRevoked
	// The NF was replaced (hot swap) or its chain stopped.
	EndReplaced
)

// OffloadReturn is what passed under an entry that ended.
type OffloadReturn struct {
	// The flow's index in this batch when a packet of it is here (its
	// flow state is then FlowState(Flow)); NoFlow otherwise.
	Flow uint32
	// The flow's hash (Packet.FlowHash), the same both ways.
	FlowHash uint64
	// The flow's key as the host hashes it.
	Key []byte
	// Whether the entry was for the reply direction.
	Reverse bool
	// Packets and bytes that passed under the entry.
	Packets, Bytes uint64
	Reason         EndReason
}

// offloaded: whether this instance ever asked to offload with counts
// returned; a batch the NF did not look at then takes what ended anyway,
// so the host keeps nothing for ever.
var offloaded bool

// Offload asks the host to offload the flow of a packet of this batch:
// its later packets in its direction get its verdict and the request's
// changes without a call. The requests go to the host in one call when
// Process returns; a refused one (an IP fragment, a change that does not
// fit the packet, a full budget) simply makes no entry. Call OffloadNow
// to see refusals.
func (b *Batch) Offload(o Offload) {
	b.offloads = append(b.offloads, o)
}

// OffloadReturns is what passed under this NF's entries that ended since
// the last batch, one per entry. Add it to whatever the NF counts per
// packet.
func (b *Batch) OffloadReturns() []OffloadReturn {
	if !b.returnsTaken {
		b.returnsTaken = true
		// Asked whenever the NF looks: entries carried here from another
		// host with their flows return to an instance that never asked.
		b.returns = Returned()
	}
	return b.returns
}

// flushOffloads sends the batch's requests and, when the NF did not look,
// takes what ended so the host keeps nothing for ever.
func (b *Batch) flushOffloads() {
	if len(b.offloads) > 0 {
		for _, o := range b.offloads {
			if !o.WithoutCounts {
				offloaded = true
			}
		}
		OffloadNow(b.offloads)
		b.offloads = nil
	}
	if !b.returnsTaken && offloaded {
		Returned()
	}
}

// OffloadNow asks the host to offload these packets' flows now: one
// result per request (nil: an entry was made or will be).
func OffloadNow(requests []Offload) []error {
	if len(requests) == 0 {
		return nil
	}
	// offload-request: packet @0, rewrites @4, idle @16, max-packets @24,
	// max-bytes @32, max-age @40, return-counts @48 (56 bytes); rewrite-op:
	// tag @0, payload @4 (16 bytes); endpoint: address @0, port option @8
	// (tag) / @10 (value).
	reqs := make([]uint64, 7*len(requests))
	mem := unsafe.Slice((*byte)(unsafe.Pointer(&reqs[0])), 56*len(requests))
	alive := make([]any, 0, len(requests))
	for i, r := range requests {
		at := 56 * i
		put32(mem, at, uint32(r.Packet))
		if len(r.Rewrites) > 0 {
			ops := make([]uint64, 2*len(r.Rewrites))
			om := unsafe.Slice((*byte)(unsafe.Pointer(&ops[0])), 16*len(r.Rewrites))
			for j, op := range r.Rewrites {
				o := 16 * j
				om[o] = op.tag
				switch op.tag {
				case 0, 1:
					alive = append(alive, op.address)
					put32(om, o+4, ptrOf(op.address))
					put32(om, o+8, uint32(len(op.address)))
					if op.hasPort {
						om[o+12] = 1
						om[o+14], om[o+15] = byte(op.port), byte(op.port>>8)
					}
				case 3:
					om[o+4] = op.dscp
				}
			}
			alive = append(alive, ops)
			put32(mem, at+4, ptrOf(ops))
			put32(mem, at+8, uint32(len(r.Rewrites)))
		}
		put64(mem, at+16, r.IdleTimeoutNs)
		put64(mem, at+24, r.MaxPackets)
		put64(mem, at+32, r.MaxBytes)
		put64(mem, at+40, r.MaxAgeNs)
		if !r.WithoutCounts {
			mem[at+48] = 1
		}
	}
	_, area, ret := scratch(8)
	offloadOffload(ptrOf(reqs), uint32(len(requests)), ret)
	runtime.KeepAlive(alive)
	runtime.KeepAlive(reqs)
	// result<_, offload-error>: tag @0; error tag @4, string @8 (16 bytes).
	out := make([]error, len(requests))
	res := bytesAt(get32(area, 0), 16*get32(area, 4))
	for i := range out {
		if i*16+16 > len(res) || res[i*16] == 0 {
			continue
		}
		tag := res[i*16+4]
		e := &OffloadError{Kind: offloadErrorNames[min(int(tag), len(offloadErrorNames)-1)]}
		if tag == 2 || tag == 3 {
			e.Detail = string(bytesAt(get32(res, i*16+8), get32(res, i*16+12)))
		}
		out[i] = e
	}
	return out
}

// Revoke ends this worker's entries of the flows with these hashes
// (Packet.FlowHash), both directions, when the batch is done.
func Revoke(flowHashes []uint64) {
	if len(flowHashes) == 0 {
		return
	}
	hs := append([]uint64(nil), flowHashes...)
	offloadRevoke(ptrOf(hs), uint32(len(hs)))
	runtime.KeepAlive(hs)
}

// RevokeAll ends every entry of this NF on this worker when the batch is
// done.
func RevokeAll() { offloadRevokeAll() }

// Returned is the entries that ended since the last call, and what passed
// under each. Batch.OffloadReturns calls it once per batch.
func Returned() []OffloadReturn {
	_, area, ret := scratch(8)
	offloadReturned(ret)
	// offload-return: flow option @0 (tag) / @4, flow-hash @8, key @16,
	// reverse @24, packets @32, bytes @40, reason @48 (56 bytes).
	n := int(get32(area, 4))
	mem := bytesAt(get32(area, 0), uint32(56*n))
	out := make([]OffloadReturn, n)
	for i := range out {
		at := 56 * i
		r := &out[i]
		r.Flow = NoFlow
		if mem[at] == 1 {
			r.Flow = get32(mem, at+4)
		}
		r.FlowHash = get64(mem, at+8)
		r.Key = append([]byte(nil), bytesAt(get32(mem, at+16), get32(mem, at+20))...)
		r.Reverse = mem[at+24] != 0
		r.Packets = get64(mem, at+32)
		r.Bytes = get64(mem, at+40)
		r.Reason = EndReason(mem[at+48])
	}
	return out
}

// offload: func(requests: list<offload-request>) -> list<result<_, offload-error>>
// Return area (8 bytes): the list (pointer, length).
//
//go:wasmimport sluice:nf/offload@0.6.0 offload
func offloadOffload(ptr, n, ret uint32)

//go:wasmimport sluice:nf/offload@0.6.0 revoke
func offloadRevoke(ptr, n uint32)

//go:wasmimport sluice:nf/offload@0.6.0 revoke-all
func offloadRevokeAll()

// returned: func() -> list<offload-return>
// Return area (8 bytes): the list (pointer, length).
//
//go:wasmimport sluice:nf/offload@0.6.0 returned
func offloadReturned(ret uint32)
