// Gives every flow an id from a pool and remembers it per flow (see nf.rs
// for the full description): new flows acquire ids bound to their IPv4
// source, ids are stored per flow, read back with lookup and reported as
// `conformance.flow` events; FIN/RST gives the id back.
package main

import (
	"encoding/binary"
	"fmt"
	"strconv"

	"sluice.dev/nf"
)

type tables struct {
	ids  nf.Bytes
	pool nf.Pool
}

func (t *tables) Init(config []byte) (nf.Info, error) {
	var err error
	if t.ids, err = nf.PerFlowBytes("ids", 8); err != nil {
		return nf.Info{}, err
	}
	t.pool, err = nf.DeclarePool("pool", 100, 1000, 4)
	return nf.Stateless(), err
}

type flow struct {
	flow  uint32
	first int
	src   [4]byte
	ends  bool
	id    uint64
	hasID bool
}

func le32(v uint32) []byte { return binary.LittleEndian.AppendUint32(nil, v) }

func (t *tables) Process(b *nf.Batch) error {
	var flows []flow
	index := map[uint32]int{}
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if p.Flow == nf.NoFlow {
			continue
		}
		ends := p.TCPFlags()&(nf.TCPFin|nf.TCPRst) != 0
		if k, ok := index[p.Flow]; ok {
			flows[k].ends = flows[k].ends || ends
			continue
		}
		var src [4]byte
		binary.BigEndian.PutUint32(src[:], p.IPv4Src())
		index[p.Flow] = len(flows)
		flows = append(flows, flow{flow: p.Flow, first: i, src: src, ends: ends})
	}
	if len(flows) == 0 {
		return nil
	}
	var keys []byte
	for _, f := range flows {
		keys = nf.PushFrame(keys, le32(f.flow))
	}
	raw, err := t.ids.GetMany(keys)
	if err != nil {
		return err
	}
	known, err := nf.Unframe(raw)
	if err != nil {
		return err
	}
	var fresh []int
	for k, v := range known {
		switch len(v) {
		case 8:
			flows[k].id, flows[k].hasID = binary.LittleEndian.Uint64(v), true
		case 0:
			fresh = append(fresh, k)
		}
	}
	if len(fresh) > 0 {
		var values []byte
		for _, k := range fresh {
			values = nf.PushFrame(values, flows[k].src[:])
		}
		ids, err := t.pool.Acquire(values)
		if err != nil {
			return err
		}
		var entries []byte
		for j, id := range ids {
			if j >= len(fresh) {
				break
			}
			f := &flows[fresh[j]]
			f.id, f.hasID = id, true
			entries = nf.PushFrame(entries, le32(f.flow))
			entries = nf.PushFrame(entries, binary.LittleEndian.AppendUint64(nil, id))
		}
		if err := t.ids.PutMany(entries); err != nil {
			return err
		}
		rawBound, err := t.pool.Lookup(ids)
		if err != nil {
			return err
		}
		bound, err := nf.Unframe(rawBound)
		if err != nil {
			return err
		}
		for j, id := range ids {
			if j >= len(fresh) || j >= len(bound) {
				break
			}
			host := "none"
			if h := bound[j]; len(h) == 4 {
				host = fmt.Sprintf("%d.%d.%d.%d", h[0], h[1], h[2], h[3])
			}
			b.Emit("conformance.flow", nf.LevelInfo, flows[fresh[j]].first,
				[2]string{"id", strconv.FormatUint(id, 10)}, [2]string{"host", host})
		}
	}
	var done []uint64
	var removals []byte
	for _, f := range flows {
		if f.ends && f.hasID {
			done = append(done, f.id)
			removals = nf.PushFrame(removals, le32(f.flow))
			removals = nf.PushFrame(removals, nil)
		}
	}
	if len(done) > 0 {
		if err := t.pool.Release(done); err != nil {
			return err
		}
		return t.ids.PutMany(removals)
	}
	return nil
}

func init() { nf.Export(&tables{}) }

func main() {}
