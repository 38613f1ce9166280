package nf

import (
	"fmt"
	"strconv"
	"strings"
)

// ConfigValue is the value of key in a config of key=value lines (spaces
// around both ignored, '#' starts a comment line).
func ConfigValue(config []byte, key string) (string, bool) {
	for _, line := range strings.Split(string(config), "\n") {
		line = strings.TrimSpace(line)
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// ParseIPv4CIDR parses "a.b.c.d[/n]" into a network and mask.
func ParseIPv4CIDR(text string) (uint32, uint32, error) {
	addr, length, hasLen := strings.Cut(text, "/")
	parts := strings.Split(addr, ".")
	if len(parts) != 4 {
		return 0, 0, fmt.Errorf("bad IPv4 address in '%s'", text)
	}
	var a uint32
	for _, p := range parts {
		v, err := strconv.ParseUint(p, 10, 8)
		if err != nil || len(p) > 3 {
			return 0, 0, fmt.Errorf("bad IPv4 address in '%s'", text)
		}
		a = a<<8 | uint32(v)
	}
	n := uint64(32)
	if hasLen {
		v, err := strconv.ParseUint(length, 10, 8)
		if err != nil || v > 32 {
			return 0, 0, fmt.Errorf("bad prefix length in '%s'", text)
		}
		n = v
	}
	mask := uint32(0)
	if n > 0 {
		mask = ^uint32(0) << (32 - n)
	}
	return a & mask, mask, nil
}

// CsumUpdate16 is the RFC 1624 incremental update of a one's-complement
// checksum when a 16-bit word changes from old to new.
func CsumUpdate16(sum, old, new uint16) uint16 {
	s := uint32(^sum) + uint32(^old) + uint32(new)
	s = s&0xffff + s>>16
	s = s&0xffff + s>>16
	return ^uint16(s)
}
