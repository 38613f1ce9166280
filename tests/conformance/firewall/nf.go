// A stateful firewall: connections from inside (`inside=<IPv4 CIDR>` in
// the config) may go out, and their replies come back; ARP passes (the
// hosts on a link must find each other's addresses to talk at all);
// anything else is dropped. Each allowed flow keeps one byte of per-flow
// state; a TCP RST forgets it.
package main

import (
	"errors"

	"sluice.dev/nf"
)

type firewall struct{ net, mask uint32 }

func (f *firewall) Init(config []byte) (nf.Info, error) {
	inside, ok := nf.ConfigValue(config, "inside")
	if !ok {
		return nf.Info{}, errors.New("config: missing inside=<IPv4 CIDR>")
	}
	var err error
	if f.net, f.mask, err = nf.ParseIPv4CIDR(inside); err != nil {
		return nf.Info{}, err
	}
	return nf.WithFlowState(0), nil
}

var allowed = []byte{1}

func (f *firewall) Process(b *nf.Batch) error {
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		fromInside := p.IsIPv4() && p.IPv4Src()&f.mask == f.net
		rst := p.TCPFlags()&nf.TCPRst != 0
		switch {
		case p.Flow == nf.NoFlow:
			// Not IP: ARP (EtherType 0x0806) passes, the rest drops.
			if !(len(p.Data) >= 14 && p.Data[12] == 0x08 && p.Data[13] == 0x06) {
				b.SetVerdict(i, nf.Drop)
			}
		case b.FlowState(p.Flow) != nil:
			if rst {
				b.RemoveFlowState(p.Flow)
			}
		case fromInside:
			b.SetFlowState(p.Flow, allowed)
			if rst {
				b.RemoveFlowState(p.Flow)
			}
		default:
			b.SetVerdict(i, nf.Drop)
		}
	}
	return nil
}

func init() { nf.Export(&firewall{}) }

func main() {}
