// A per-source SYN guard on two single-writer tables, both with
// sync-interval-ns 0: the counter table `syns`, keyed by the IPv4 source
// address (its big-endian value widened to u64), counts TCP SYN packets
// without ACK; the byte table `blocked` (key-size 4: the IPv4 source in
// network order; max-value-size 1) holds the blocked sources. A TCP packet
// is an IPv4 packet whose whole TCP header was captured. Each batch:
// (a) at its start, one `get-many` on `blocked` for the distinct sources of
// the batch's TCP packets and one `counter-get` on `syns` for the distinct
// sources of its SYN-without-ACK packets, both in order of first
// appearance; decisions use only these reads, never counts from the same
// batch; (b) every TCP packet whose source has a value in `blocked` is
// dropped, and every SYN-without-ACK packet whose source's `syns` count
// read at the start is 3 or more is dropped; everything else is forwarded
// unchanged; (c) at its end, one `counter-add` on `syns` with one key per
// distinct SYN-without-ACK source (in order of first appearance) and that
// source's number of SYN-without-ACK packets in the batch as its delta, and
// one `put-many` on `blocked` writing the value [1] for every such source
// (same order) whose count read at the start plus the batch's SYNs from it
// is 8 or more and that was not blocked at the start. Non-IPv4 and non-TCP
// packets are forwarded and touch no table; a call whose list is empty is
// skipped. Since decisions use only batch-start reads, the output is the
// same for 1 and 2 workers.
package main

import (
	"encoding/binary"

	"sluice.dev/nf"
)

// Drops the SYNs of a source once it has sent this many (read at the start
// of a batch); blocks it once it has sent blockAt.
const (
	synLimit = 3
	blockAt  = 8
)

type guard struct {
	syns    nf.Counters
	blocked nf.Bytes
}

func (g *guard) Init(config []byte) (nf.Info, error) {
	var err error
	if g.syns, err = nf.SingleWriterCounters("syns", 0); err != nil {
		return nf.Info{}, err
	}
	g.blocked, err = nf.SingleWriterBytes("blocked", 4, 1, 0)
	return nf.Stateless(), err
}

type tcpPacket struct {
	index int
	src   int // index in sources
	syn   bool
}

type source struct {
	addr    uint32
	blocked bool
	syn     int // index in synSources, or -1
}

type synSource struct {
	source int
	syns   int64
	count  uint64
}

func be32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func (g *guard) Process(b *nf.Batch) error {
	var tcp []tcpPacket
	var sources []source
	var syns []synSource
	index := map[uint32]int{}
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if !p.IsIPv4() || !p.IsTCP() {
			continue
		}
		addr := p.IPv4Src()
		k, seen := index[addr]
		if !seen {
			k = len(sources)
			index[addr] = k
			sources = append(sources, source{addr: addr, syn: -1})
		}
		flags := p.TCPFlags()
		syn := flags&nf.TCPSyn != 0 && flags&nf.TCPAck == 0
		tcp = append(tcp, tcpPacket{index: i, src: k, syn: syn})
		if syn {
			if sources[k].syn < 0 {
				sources[k].syn = len(syns)
				syns = append(syns, synSource{source: k})
			}
			syns[sources[k].syn].syns++
		}
	}
	// (a) The tables as of the start of the batch.
	if len(sources) > 0 {
		var keys []byte
		for _, s := range sources {
			keys = nf.PushFrame(keys, be32(s.addr))
		}
		raw, err := g.blocked.GetMany(keys)
		if err != nil {
			return err
		}
		values, err := nf.Unframe(raw)
		if err != nil {
			return err
		}
		for k, v := range values {
			if k < len(sources) {
				sources[k].blocked = len(v) > 0
			}
		}
	}
	keys := make([]uint64, len(syns))
	deltas := make([]int64, len(syns))
	for j, s := range syns {
		keys[j], deltas[j] = uint64(sources[s.source].addr), s.syns
	}
	if len(syns) > 0 {
		counts, err := g.syns.Get(keys)
		if err != nil {
			return err
		}
		for j, c := range counts {
			if j < len(syns) {
				syns[j].count = c
			}
		}
	}
	// (b) Verdicts from those reads only.
	for _, t := range tcp {
		s := sources[t.src]
		if s.blocked || (t.syn && syns[s.syn].count >= synLimit) {
			b.SetVerdict(t.index, nf.Drop)
		}
	}
	// (c) This batch's SYNs, and the sources they push over the limit.
	if len(syns) > 0 {
		if err := g.syns.Add(keys, deltas); err != nil {
			return err
		}
	}
	var entries []byte
	for _, s := range syns {
		src := sources[s.source]
		if s.count+uint64(s.syns) >= blockAt && !src.blocked {
			entries = nf.PushFrame(entries, be32(src.addr))
			entries = nf.PushFrame(entries, []byte{1})
		}
	}
	if len(entries) > 0 {
		return g.blocked.PutMany(entries)
	}
	return nil
}

func init() { nf.Export(&guard{}) }

func main() {}
