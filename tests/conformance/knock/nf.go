// Port knocking on a single-writer byte table `stage` (key-size 4: the
// IPv4 source address in network order; max-value-size 1;
// sync-interval-ns 10,000,000): a source that sends TCP SYNs to ports
// 7000, 8000 and 9000, in that order, may then open connections to port
// 22. A TCP packet is an IPv4 packet whose whole TCP header was
// captured; a knock is a TCP SYN without ACK. Each knock, in packet
// order, reads its source's stage s with one `get-many` (0 when absent,
// else the value's byte), then: to port 22, it is forwarded when s is 3
// and dropped otherwise; to port 7000, 8000 or 9000 when that is the
// next port of the sequence (s < 3 and the port is the (s+1)-th), one
// `put-many` sets the stage to s + 1; to any other port while 0 < s < 3,
// one `put-many` removes the key (an empty value: the sequence starts
// over). Knocks to other ports than 22 are forwarded; every other packet
// is forwarded and touches no table. A stage of 3 stays. Each packet sees
// the writes of the packets before it, in the same batch too.
package main

import (
	"encoding/binary"

	"sluice.dev/nf"
)

// The ports to knock on, in order; the stage of a source that knocked them
// all; the port they open.
var sequence = [...]uint16{7000, 8000, 9000}

const (
	opened  = 3
	guarded = 22
)

type knock struct {
	stage nf.Bytes
}

func (k *knock) Init(config []byte) (nf.Info, error) {
	var err error
	k.stage, err = nf.SingleWriterBytes("stage", 4, 1, 10_000_000)
	return nf.Stateless(), err
}

// stageOf reads the stage of a source (network order): one get-many.
func (k *knock) stageOf(src []byte) (uint8, error) {
	raw, err := k.stage.GetMany(nf.PushFrame(nil, src))
	if err != nil {
		return 0, err
	}
	values, err := nf.Unframe(raw)
	if err != nil {
		return 0, err
	}
	if len(values) == 0 || len(values[0]) == 0 {
		return 0, nil
	}
	return values[0][0], nil
}

// setStage sets the stage of a source (an empty value removes it): one
// put-many.
func (k *knock) setStage(src, value []byte) error {
	return k.stage.PutMany(nf.PushFrame(nf.PushFrame(nil, src), value))
}

func (k *knock) Process(b *nf.Batch) error {
	for i := 0; i < b.Len(); i++ {
		p := b.Packet(i)
		if !p.IsIPv4() || !p.IsTCP() {
			continue
		}
		flags := p.TCPFlags()
		if flags&nf.TCPSyn == 0 || flags&nf.TCPAck != 0 {
			continue
		}
		src := binary.BigEndian.AppendUint32(nil, p.IPv4Src())
		s, err := k.stageOf(src)
		if err != nil {
			return err
		}
		port := p.DstPort()
		switch {
		case port == guarded:
			if s != opened {
				b.SetVerdict(i, nf.Drop)
			}
		case s < opened && sequence[s] == port:
			err = k.setStage(src, []byte{s + 1})
		case s > 0 && s < opened:
			err = k.setStage(src, nil)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

func init() { nf.Export(&knock{}) }

func main() {}
