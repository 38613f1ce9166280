// Counts IPv4 TCP packets per destination port and lists the table with
// scan and top-k (see nf.rs for the full description): per batch, one
// counter-add on the eventual table `ports`; on the batch's first SYN (ACK
// clear), a `conformance.scan` event with the top 3 ports, what a full
// scan of `ports` in pages of 16 walks, and the keys of the read-only byte
// table `names` scanned in pages of 2.
package main

import (
	"fmt"
	"strconv"
	"strings"

	"sluice.dev/nf"
)

type scan struct {
	ports nf.Counters
	names nf.Bytes
}

func (s *scan) Init(config []byte) (nf.Info, error) {
	var err error
	if s.ports, err = nf.EventualCounters("ports", nf.MergeSum, 0); err != nil {
		return nf.Info{}, err
	}
	if s.names, err = nf.ReadOnlyBytes("names", 0, 8); err != nil {
		return nf.Info{}, err
	}
	var entries []byte
	for _, e := range [][2]string{{"http", "80"}, {"https", "443"}, {"dns", "53"}, {"ssh", "22"}, {"ntp", "123"}} {
		entries = nf.PushFrame(entries, []byte(e[0]))
		entries = nf.PushFrame(entries, []byte(e[1]))
	}
	return nf.Stateless(), s.names.PutMany(entries)
}

func (s *scan) Process(b *nf.Batch) error {
	var keys []uint64
	var counts []int64
	trigger := -1
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if !p.IsIPv4() || !p.IsTCP() {
			continue
		}
		port := uint64(p.DstPort())
		at := -1
		for j, k := range keys {
			if k == port {
				at = j
			}
		}
		if at < 0 {
			keys = append(keys, port)
			counts = append(counts, 1)
		} else {
			counts[at]++
		}
		flags := p.TCPFlags()
		if trigger < 0 && flags&nf.TCPSyn != 0 && flags&nf.TCPAck == 0 {
			trigger = i
		}
	}
	if len(keys) > 0 {
		if err := s.ports.Add(keys, counts); err != nil {
			return err
		}
	}
	if trigger < 0 {
		return nil
	}
	topK, err := s.ports.TopK(3)
	if err != nil {
		return err
	}
	top := make([]string, len(topK))
	for i, e := range topK {
		top[i] = fmt.Sprintf("%d=%d", e.Key, e.Value)
	}
	var entries, pages, total uint64
	ascending, first, last := true, true, uint64(0)
	var cursor []byte
	for {
		page, next, err := s.ports.Scan(cursor, 16)
		if err != nil {
			return err
		}
		pages++
		for _, e := range page {
			entries++
			total += e.Value
			ascending = ascending && (first || e.Key > last)
			first, last = false, e.Key
		}
		if len(next) == 0 {
			break
		}
		cursor = next
	}
	all, err := s.names.All(2)
	if err != nil {
		return err
	}
	names := make([]string, len(all))
	for i, e := range all {
		names[i] = string(e.Key)
	}
	asc := "no"
	if ascending {
		asc = "yes"
	}
	b.Emit("conformance.scan", nf.LevelInfo, trigger,
		[2]string{"top", strings.Join(top, ",")},
		[2]string{"entries", strconv.FormatUint(entries, 10)},
		[2]string{"pages", strconv.FormatUint(pages, 10)},
		[2]string{"total", strconv.FormatUint(total, 10)},
		[2]string{"ascending", asc},
		[2]string{"names", strings.Join(names, ",")})
	return nil
}

func init() { nf.Export(&scan{}) }

func main() {}
