// Reports every TCP connection attempt: for each IPv4 TCP packet with SYN
// set and ACK clear, a `conformance.syn` event (level info, the packet's
// index, fields `src` and `dst` as `a.b.c.d:port`). A batch's events go to
// the host in one call. Every packet is forwarded.
package main

import (
	"fmt"

	"sluice.dev/nf"
)

type syns struct{}

func (s *syns) Init(config []byte) (nf.Info, error) { return nf.Stateless(), nil }

func endpoint(a uint32, port uint16) string {
	return fmt.Sprintf("%d.%d.%d.%d:%d", a>>24, a>>16&0xff, a>>8&0xff, a&0xff, port)
}

func (s *syns) Process(b *nf.Batch) error {
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if !p.IsIPv4() || !p.IsTCP() {
			continue
		}
		flags := p.TCPFlags()
		if flags&nf.TCPSyn != 0 && flags&nf.TCPAck == 0 {
			b.Emit("conformance.syn", nf.LevelInfo, i,
				[2]string{"src", endpoint(p.IPv4Src(), p.SrcPort())},
				[2]string{"dst", endpoint(p.IPv4Dst(), p.DstPort())})
		}
	}
	return nil
}

func init() { nf.Export(&syns{}) }

func main() {}
