// An IPv4 prefix translator: every address in `from=<CIDR>` becomes the
// same host in `to=<CIDR>` (source and destination), with the IPv4 and
// TCP/UDP checksums updated incrementally (RFC 1624). A UDP checksum of 0
// (none) stays 0. Other packets pass unchanged.
package main

import (
	"errors"

	"sluice.dev/nf"
)

type rewriter struct{ fromNet, fromMask, toNet, toMask uint32 }

func (r *rewriter) Init(config []byte) (nf.Info, error) {
	from, ok := nf.ConfigValue(config, "from")
	if !ok {
		return nf.Info{}, errors.New("config: missing from=<IPv4 CIDR>")
	}
	to, ok := nf.ConfigValue(config, "to")
	if !ok {
		return nf.Info{}, errors.New("config: missing to=<IPv4 CIDR>")
	}
	var err error
	if r.fromNet, r.fromMask, err = nf.ParseIPv4CIDR(from); err != nil {
		return nf.Info{}, err
	}
	if r.toNet, r.toMask, err = nf.ParseIPv4CIDR(to); err != nil {
		return nf.Info{}, err
	}
	if r.fromMask != r.toMask {
		return nf.Info{}, errors.New("config: from and to must have the same prefix length")
	}
	return nf.Stateless(), nil
}

func be16(d []byte, at int) uint16 { return uint16(d[at])<<8 | uint16(d[at+1]) }

func put16(d []byte, at int, v uint16) { d[at], d[at+1] = byte(v>>8), byte(v) }

func (r *rewriter) in(a uint32) bool { return a&r.fromMask == r.fromNet }

// translate rewrites the address at `at` if it is in `from`, fixing the
// checksums at ipSum and (if not 0) l4Sum.
func (r *rewriter) translate(d []byte, at, ipSum, l4Sum int) {
	old := uint32(d[at])<<24 | uint32(d[at+1])<<16 | uint32(d[at+2])<<8 | uint32(d[at+3])
	if !r.in(old) {
		return
	}
	next := r.toNet | old&^r.toMask
	words := [2][2]uint16{{uint16(old >> 16), uint16(next >> 16)}, {uint16(old), uint16(next)}}
	for w, on := range words {
		put16(d, at+2*w, on[1])
		put16(d, ipSum, nf.CsumUpdate16(be16(d, ipSum), on[0], on[1]))
		if l4Sum != 0 {
			put16(d, l4Sum, nf.CsumUpdate16(be16(d, l4Sum), on[0], on[1]))
		}
	}
}

func (r *rewriter) Process(b *nf.Batch) error {
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if !p.IsIPv4() || (!r.in(p.IPv4Src()) && !r.in(p.IPv4Dst())) {
			continue
		}
		l3, l4, n, proto := int(p.L3Offset), int(p.L4Offset), len(p.Data), p.IPProto()
		l4Sum := 0
		if p.L4Offset != nf.NoL4 {
			if proto == 6 && l4+18 <= n {
				l4Sum = l4 + 16
			}
			if proto == 17 && l4+8 <= n && be16(p.Data, l4+6) != 0 {
				l4Sum = l4 + 6
			}
		}
		d := append([]byte(nil), p.Data...)
		r.translate(d, l3+12, l3+10, l4Sum)
		r.translate(d, l3+16, l3+10, l4Sum)
		if proto == 17 && l4Sum != 0 && be16(d, l4Sum) == 0 {
			put16(d, l4Sum, 0xffff)
		}
		b.Rewrite(i, d)
	}
	return nil
}

func init() { nf.Export(&rewriter{}) }

func main() {}
