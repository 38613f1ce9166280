// A stateful firewall that offloads established flows: connections from
// inside (`inside=<IPv4 CIDR>`) may go out and their replies come back;
// anything else is dropped; a TCP RST forgets the flow's one byte of
// state. With `dscp=<0..63>` every forwarded packet gets that DSCP (the
// IPv4 header checksum updated incrementally). Forwarded packets and their
// bytes on the wire are counted in the eventual counter table `forwarded`
// (key 0: packets, key 1: bytes), one counter-add per batch.
//
// With `offload=true`, a forwarded TCP or UDP packet of a flow that had
// state before it, carrying none of SYN, FIN, RST, has its flow offloaded
// in its direction (the same DSCP change, counts returned), and the
// packets and bytes of every ended entry are added to `forwarded`: the
// output and the table are the same with offload and without. With
// `offload-after=<n>` a direction is offloaded at its nth such packet
// (default 1: at its first), counted with nf.
// A FIN marks the flow closing (state byte 2): nothing of it is
// offloaded after that; a SYN on it opens it again.Admission.
package main

import (
	"errors"
	"fmt"

	"sluice.dev/nf"
)

type firewall struct {
	net, mask uint32
	dscp      int64
	offload   bool
	rewrites  []nf.RewriteOp
	forwarded nf.Counters
	gate      *nf.Admission
}

func (f *firewall) Init(config []byte) (nf.Info, error) {
	inside, ok := nf.ConfigValue(config, "inside")
	if !ok {
		return nf.Info{}, errors.New("config: missing inside=<IPv4 CIDR>")
	}
	var err error
	if f.net, f.mask, err = nf.ParseIPv4CIDR(inside); err != nil {
		return nf.Info{}, err
	}
	if f.dscp, err = nf.ConfigInt(config, "dscp", -1); err != nil {
		return nf.Info{}, err
	}
	if f.dscp < -1 || f.dscp > 63 {
		return nf.Info{}, fmt.Errorf("config: dscp = %d: not 0 to 63", f.dscp)
	}
	if f.offload, err = nf.ConfigBool(config, "offload", false); err != nil {
		return nf.Info{}, err
	}
	after, err := nf.ConfigInt(config, "offload-after", 1)
	if err != nil {
		return nf.Info{}, err
	}
	if after < 0 || after > 1000000 {
		return nf.Info{}, fmt.Errorf("config: offload-after = %d: not 0 to 1000000", after)
	}
	f.gate = nf.NewAdmission(uint32(after), 4096)
	if f.dscp >= 0 {
		f.rewrites = []nf.RewriteOp{nf.SetDSCP(uint8(f.dscp))}
	}
	if f.forwarded, err = nf.SumCounters("forwarded", 0); err != nil {
		return nf.Info{}, err
	}
	return nf.WithFlowState(0), nil
}

// A flow's state: allowed, and allowed with a FIN seen (no offload from
// then on: what is left of the connection is a few packets).
var allowed, closingState = []byte{1}, []byte{2}

func (f *firewall) Process(b *nf.Batch) error {
	var packets, bytes int64
	for _, r := range b.OffloadReturns() {
		packets += int64(r.Packets)
		bytes += int64(r.Bytes)
	}
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if p.Flow == nf.NoFlow {
			b.SetVerdict(i, nf.Drop)
			continue
		}
		flags := p.TCPFlags()
		state := b.FlowState(p.Flow)
		known := state != nil
		closing := len(state) > 0 && state[0] == closingState[0]
		switch {
		case known:
			if flags&nf.TCPRst != 0 {
				b.RemoveFlowState(p.Flow)
			}
			if flags&nf.TCPSyn != 0 {
				// A new connection on the flow's 5-tuple.
				if closing {
					b.SetFlowState(p.Flow, allowed)
				}
				f.gate.Forget(&p)
			} else if flags&nf.TCPFin != 0 && !closing {
				b.SetFlowState(p.Flow, closingState)
			}
		case p.IsIPv4() && p.IPv4Src()&f.mask == f.net:
			b.SetFlowState(p.Flow, allowed)
			f.gate.Forget(&p)
			if flags&nf.TCPRst != 0 {
				b.RemoveFlowState(p.Flow)
			}
		default:
			b.SetVerdict(i, nf.Drop)
			continue
		}
		packets++
		bytes += int64(p.WireLen)
		if f.dscp >= 0 && p.IsIPv4() {
			d := append([]byte(nil), p.Data...)
			l3 := int(p.L3Offset)
			old := uint16(d[l3])<<8 | uint16(d[l3+1])
			d[l3+1] = byte(f.dscp)<<2 | d[l3+1]&3
			s := nf.CsumUpdate16(uint16(d[l3+10])<<8|uint16(d[l3+11]), old, uint16(d[l3])<<8|uint16(d[l3+1]))
			d[l3+10], d[l3+11] = byte(s>>8), byte(s)
			b.Rewrite(i, d)
		}
		eligible := p.IsUDP() || (p.IsTCP() && flags&(nf.TCPSyn|nf.TCPFin|nf.TCPRst) == 0)
		if f.offload && known && !closing && eligible && f.gate.Admit(&p) {
			b.Offload(nf.Offload{Packet: i, Rewrites: f.rewrites})
		}
	}
	if packets > 0 {
		return f.forwarded.Add([]uint64{0, 1}, []int64{packets, bytes})
	}
	return nil
}

func init() { nf.Export(&firewall{}) }

func main() {}
