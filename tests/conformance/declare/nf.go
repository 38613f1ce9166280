// Declares one table of every kind with the SDK's helpers, sized by a
// configuration read with the typed getters, and exercises the IPv6
// accessors and the index of a refused item (see nf.rs for the full
// description): per batch, the largest packet per source in an eventual
// max table whose refusal drops the refused sources, packets per flow, and
// IPv6 source -> destination in a single-writer byte table.
package main

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"math"
	"strconv"

	"sluice.dev/nf"
)

const ms = 1_000_000

type declare struct {
	largest, packets, seen nf.Counters
	v6, notes              nf.Bytes
	ports                  nf.Pool
	scale                  float64
	v6Events               bool
	tag                    string
}

func (d *declare) Init(config []byte) (nf.Info, error) {
	capacity, err := nf.ConfigInt(config, "capacity", 65536)
	if err != nil {
		return nf.Info{}, err
	}
	if capacity < 0 || capacity > math.MaxUint32 {
		return nf.Info{}, errors.New("capacity: out of range")
	}
	idleMs, err := nf.ConfigInt(config, "idle-ms", 0)
	if err != nil {
		return nf.Info{}, err
	}
	if idleMs < 0 {
		return nf.Info{}, errors.New("idle-ms: negative")
	}
	idleNs := uint64(idleMs) * ms
	if d.scale, err = nf.ConfigFloat(config, "scale", 1.0); err != nil {
		return nf.Info{}, err
	}
	if d.v6Events, err = nf.ConfigBool(config, "v6-events", false); err != nil {
		return nf.Info{}, err
	}
	d.tag = nf.ConfigString(config, "tag", "none")
	poolFirst, err := nf.ConfigInt(config, "pool-first", 5000)
	if err != nil {
		return nf.Info{}, err
	}
	if poolFirst < 0 {
		return nf.Info{}, errors.New("pool-first: negative")
	}

	if d.largest, err = nf.EventualCounters("largest", nf.MergeMax, 0,
		nf.WithCapacity(uint32(capacity)), nf.WithIdleTimeout(idleNs)); err != nil {
		return nf.Info{}, err
	}
	if d.packets, err = nf.PerFlowCounters("packets", nf.WithIdleTimeout(idleNs)); err != nil {
		return nf.Info{}, err
	}
	if d.v6, err = nf.SingleWriterBytes("v6", 16, 16, 0, nf.WithCapacity(1000)); err != nil {
		return nf.Info{}, err
	}
	if d.seen, err = nf.SingleWriterCounters("seen", 0, nf.WithCapacity(1000), nf.WithIdleTimeout(1000*ms)); err != nil {
		return nf.Info{}, err
	}
	if d.notes, err = nf.PerFlowBytes("notes", 8, nf.WithCapacity(4096), nf.WithIdleTimeout(1000*ms)); err != nil {
		return nf.Info{}, err
	}
	weights, err := nf.ReadOnlyCounters("weights", nf.WithCapacity(16))
	if err != nil {
		return nf.Info{}, err
	}
	if err := weights.Add([]uint64{1, 2, 3}, []int64{10, 20, 30}); err != nil {
		return nf.Info{}, err
	}
	names, err := nf.ReadOnlyBytes("names", 0, 16, nf.WithCapacity(16))
	if err != nil {
		return nf.Info{}, err
	}
	if err := names.PutMany(nf.PushFrame(nf.PushFrame(nil, []byte("tag")), []byte(d.tag))); err != nil {
		return nf.Info{}, err
	}
	d.ports, err = nf.DeclarePool("ports", uint64(poolFirst), 100, 4, nf.WithChunk(10))
	return nf.Stateless(), err
}

type source struct {
	key     uint64
	first   int
	largest uint32
}

type flow struct {
	flow  uint64
	count int64
}

type v6Packet struct {
	index    int
	src, dst [16]byte
}

func (d *declare) Process(b *nf.Batch) error {
	sourceOf := make([]uint64, b.Len())
	hasSource := make([]bool, b.Len())
	var sources []source
	index := map[uint64]int{}
	var flows []flow
	flowIndex := map[uint32]int{}
	var v6 []v6Packet
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		switch {
		case p.IsIPv4():
			sourceOf[i], hasSource[i] = uint64(p.IPv4Src()), true
		case p.IsIPv6():
			src := p.IPv6Src()
			v6 = append(v6, v6Packet{i, src, p.IPv6Dst()})
			sourceOf[i], hasSource[i] = binary.BigEndian.Uint64(src[8:])|1<<63, true
		}
		if hasSource[i] {
			if k, ok := index[sourceOf[i]]; ok {
				sources[k].largest = max(sources[k].largest, p.WireLen)
			} else {
				index[sourceOf[i]] = len(sources)
				sources = append(sources, source{sourceOf[i], i, p.WireLen})
			}
		}
		if p.Flow != nf.NoFlow {
			if k, ok := flowIndex[p.Flow]; ok {
				flows[k].count++
			} else {
				flowIndex[p.Flow] = len(flows)
				flows = append(flows, flow{uint64(p.Flow), 1})
			}
		}
	}
	// (1) The largest packet per source; a full table refuses a source and
	// every one after it.
	if len(sources) > 0 {
		keys := make([]uint64, len(sources))
		values := make([]int64, len(sources))
		for k, s := range sources {
			keys[k], values[k] = s.key, int64(math.Floor(float64(s.largest)*d.scale))
		}
		if err := d.largest.Add(keys, values); err != nil {
			var se *nf.StateError
			if !errors.As(err, &se) || se.Kind != "full" {
				return err
			}
			item, ok := se.Item()
			if !ok || int(item) >= len(keys) {
				return err
			}
			refused := map[uint64]bool{}
			for _, k := range keys[item:] {
				refused[k] = true
			}
			for i := range sourceOf {
				if hasSource[i] && refused[sourceOf[i]] {
					b.SetVerdict(i, nf.Drop)
				}
			}
			b.Emit("conformance.full", nf.LevelWarn, sources[item].first,
				[2]string{"item", strconv.Itoa(int(item))}, [2]string{"sources", strconv.Itoa(len(keys))})
		}
	}
	// (2) Packets per flow.
	if len(flows) > 0 {
		keys := make([]uint64, len(flows))
		deltas := make([]int64, len(flows))
		for k, f := range flows {
			keys[k], deltas[k] = f.flow, f.count
		}
		if err := d.packets.Add(keys, deltas); err != nil {
			return err
		}
	}
	// (3) IPv6 source -> destination.
	if len(v6) > 0 {
		var entries []byte
		for _, p := range v6 {
			entries = nf.PushFrame(nf.PushFrame(entries, p.src[:]), p.dst[:])
		}
		if err := d.v6.PutMany(entries); err != nil {
			return err
		}
		if d.v6Events {
			first := v6[0]
			b.Emit("conformance.v6", nf.LevelInfo, first.index, [2]string{"src", hex.EncodeToString(first.src[:])},
				[2]string{"dst", hex.EncodeToString(first.dst[:])}, [2]string{"tag", d.tag})
		}
	}
	return nil
}

func init() { nf.Export(&declare{}) }

func main() {}
