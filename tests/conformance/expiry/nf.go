// Remembers each flow for 2 ms of packet time and reports when the host
// forgets it (see nf.rs for the full description): per-flow packet counts
// in a per-flow byte table with notify-expired; Expired emits one
// `conformance.expired` event per entry.
package main

import (
	"encoding/binary"
	"encoding/hex"
	"strconv"

	"sluice.dev/nf"
)

type expiry struct{ recent nf.Bytes }

func (e *expiry) Init(config []byte) (nf.Info, error) {
	var err error
	e.recent, err = nf.PerFlowBytesExpiring("recent", 8, 2_000_000, true)
	return nf.Stateless(), err
}

func (e *expiry) Process(b *nf.Batch) error {
	var order []uint32
	counts := map[uint32]uint64{}
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if p.Flow == nf.NoFlow {
			continue
		}
		if _, ok := counts[p.Flow]; !ok {
			order = append(order, p.Flow)
		}
		counts[p.Flow]++
	}
	if len(order) == 0 {
		return nil
	}
	var entries []byte
	for _, f := range order {
		entries = nf.PushFrame(entries, binary.LittleEndian.AppendUint32(nil, f))
		entries = nf.PushFrame(entries, binary.LittleEndian.AppendUint64(nil, counts[f]))
	}
	return e.recent.PutMany(entries)
}

func (e *expiry) Expired(table uint32, entries []byte) error {
	items, err := nf.Unframe(entries)
	if err != nil {
		return err
	}
	var events []nf.Event
	for i := 0; i+1 < len(items); i += 2 {
		packets := uint64(0)
		if len(items[i+1]) == 8 {
			packets = binary.LittleEndian.Uint64(items[i+1])
		}
		events = append(events, nf.Event{Kind: "conformance.expired", Level: nf.LevelInfo,
			Fields: [][2]string{{"key", hex.EncodeToString(items[i])}, {"packets", strconv.FormatUint(packets, 10)}}})
	}
	nf.Emit(events...)
	return nil
}

func init() { nf.Export(&expiry{}) }

func main() {}
