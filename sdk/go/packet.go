//go:build wasip1

package nf

// Packet is one packet of a batch: its bytes and what the host parsed out
// of them. Accessors return 0/false when a header was not captured, under
// the same rules as the host's parser.
type Packet struct {
	Data        []byte
	WireLen     uint32
	TimestampNs uint64
	FlowHash    uint64
	// Index of the packet's flow in the batch, or NoFlow.
	Flow        uint32
	IngressPort uint16
	L4Offset    uint16
	L3Offset    uint8
	Flags       uint8
}

func be16(d []byte, at int) uint16 {
	if at < 0 || at+2 > len(d) {
		return 0
	}
	return uint16(d[at])<<8 | uint16(d[at+1])
}

func be32(d []byte, at int) uint32 {
	if at < 0 || at+4 > len(d) {
		return 0
	}
	return uint32(d[at])<<24 | uint32(d[at+1])<<16 | uint32(d[at+2])<<8 | uint32(d[at+3])
}

// IsIPv4 reports an IPv4 packet whose whole IP header was captured.
func (p *Packet) IsIPv4() bool {
	l3, d := int(p.L3Offset), p.Data
	if p.L3Offset == NoL3 || p.Flags&FlagIPv6 != 0 || l3+20 > len(d) || d[l3]>>4 != 4 {
		return false
	}
	hl := int(d[l3]&0x0f) * 4
	return hl >= 20 && l3+hl <= len(d) && int(be16(d, l3+2)) >= hl
}

// IPProto is the IP protocol (for IPv6 the first next header), 0 if not IP.
func (p *Packet) IPProto() uint8 {
	if p.L3Offset == NoL3 {
		return 0
	}
	if p.Flags&FlagIPv6 == 0 {
		if !p.IsIPv4() {
			return 0
		}
		return p.Data[int(p.L3Offset)+9]
	}
	at := int(p.L3Offset) + 6
	if at >= len(p.Data) {
		return 0
	}
	return p.Data[at]
}

// IPv4Src is the IPv4 source address (0 if not IPv4).
func (p *Packet) IPv4Src() uint32 {
	if !p.IsIPv4() {
		return 0
	}
	return be32(p.Data, int(p.L3Offset)+12)
}

// IPv4Dst is the IPv4 destination address (0 if not IPv4).
func (p *Packet) IPv4Dst() uint32 {
	if !p.IsIPv4() {
		return 0
	}
	return be32(p.Data, int(p.L3Offset)+16)
}

// IsIPv6 reports an IPv6 packet whose fixed 40-byte IP header was captured.
func (p *Packet) IsIPv6() bool {
	l3 := int(p.L3Offset)
	return p.L3Offset != NoL3 && p.Flags&FlagIPv6 != 0 && l3+40 <= len(p.Data) && p.Data[l3]>>4 == 6
}

// IPv6Src is the IPv6 source address, its 16 bytes in network order (all
// zero if not IPv6).
func (p *Packet) IPv6Src() (a [16]byte) {
	if p.IsIPv6() {
		copy(a[:], p.Data[int(p.L3Offset)+8:])
	}
	return a
}

// IPv6Dst is the IPv6 destination address, its 16 bytes in network order
// (all zero if not IPv6).
func (p *Packet) IPv6Dst() (a [16]byte) {
	if p.IsIPv6() {
		copy(a[:], p.Data[int(p.L3Offset)+24:])
	}
	return a
}

// IsTCP reports a TCP packet whose whole TCP header was captured.
func (p *Packet) IsTCP() bool {
	l4, d := int(p.L4Offset), p.Data
	if p.L4Offset == NoL4 || p.IPProto() != 6 || l4+20 > len(d) {
		return false
	}
	hl := int(d[l4+12]>>4) * 4
	return hl >= 20 && l4+hl <= len(d)
}

// IsUDP reports a UDP packet whose UDP header was captured.
func (p *Packet) IsUDP() bool {
	return p.L4Offset != NoL4 && p.IPProto() == 17 && int(p.L4Offset)+8 <= len(p.Data)
}

// SrcPort is the TCP/UDP source port (0 if absent).
func (p *Packet) SrcPort() uint16 {
	if !p.IsTCP() && !p.IsUDP() {
		return 0
	}
	return be16(p.Data, int(p.L4Offset))
}

// DstPort is the TCP/UDP destination port (0 if absent).
func (p *Packet) DstPort() uint16 {
	if !p.IsTCP() && !p.IsUDP() {
		return 0
	}
	return be16(p.Data, int(p.L4Offset)+2)
}

// TCPFlags is the TCP flags byte, 0 if not TCP.
func (p *Packet) TCPFlags() uint8 {
	if !p.IsTCP() {
		return 0
	}
	return p.Data[int(p.L4Offset)+13]
}
