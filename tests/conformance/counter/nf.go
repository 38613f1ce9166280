// Forwards every packet and counts packets and bytes on the wire in the
// host table `totals` (key 0: packets, key 1: bytes), one counter-add per
// batch.
package main

import "sluice.dev/nf"

type counter struct{ totals nf.Counters }

func (c *counter) Init(config []byte) (nf.Info, error) {
	var err error
	c.totals, err = nf.SumCounters("totals", 0)
	return nf.Stateless(), err
}

func (c *counter) Process(b *nf.Batch) error {
	var bytes int64
	for i := 0; i < b.Len(); i++ {
		bytes += int64(b.Packet(i).WireLen)
	}
	return c.totals.Add([]uint64{0, 1}, []int64{int64(b.Len()), bytes})
}

func init() { nf.Export(&counter{}) }

func main() {}
