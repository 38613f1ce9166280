package nf

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// ConfigValue is the value of key in a config of key=value lines (spaces
// around both ignored, '#' starts a comment line, the first line with the
// key wins).
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

// ConfigString is the value of key, or def when the config has no such
// key (an empty value, "key =", is "").
func ConfigString(config []byte, key, def string) string {
	if v, ok := ConfigValue(config, key); ok {
		return v
	}
	return def
}

// ConfigInt is the value of key as an integer, or def when the config has
// no such key. The value is decimal digits with an optional sign ("30000",
// "-7", "+3"); nothing else is accepted, so every SDK reads a config the
// same way. The error names the key and the value ("capacity = 12k: not an
// integer", "...: integer out of range"), ready to return from Init.
func ConfigInt(config []byte, key string, def int64) (int64, error) {
	v, ok := ConfigValue(config, key)
	if !ok {
		return def, nil
	}
	digits := strings.TrimLeft(v, "+-")
	if len(v)-len(digits) > 1 || !allDigits(digits) {
		return 0, fmt.Errorf("%s = %s: not an integer", key, v)
	}
	n, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("%s = %s: integer out of range", key, v)
	}
	return n, nil
}

// ConfigFloat is the value of key as a float64, or def when the config has
// no such key. The value is a decimal number with an optional sign,
// fraction and exponent ("1.5", ".5", "2e-3", "3"); "inf", "nan",
// hexadecimal, underscores and values too large for a float64 are an
// error ("rate = fast: not a number").
func ConfigFloat(config []byte, key string, def float64) (float64, error) {
	v, ok := ConfigValue(config, key)
	if !ok {
		return def, nil
	}
	bad := fmt.Errorf("%s = %s: not a number", key, v)
	if !decimalFloat(v) {
		return 0, bad
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || math.IsInf(f, 0) {
		return 0, bad
	}
	return f, nil
}

// ConfigBool is the value of key as a bool, or def when the config has no
// such key: "true", "yes", "on", "1" are true and "false", "no", "off",
// "0" false, in any case; anything else is an error ("log = maybe: not a
// boolean (true/false, yes/no, on/off, 1/0)").
func ConfigBool(config []byte, key string, def bool) (bool, error) {
	v, ok := ConfigValue(config, key)
	if !ok {
		return def, nil
	}
	switch strings.ToLower(v) {
	case "true", "yes", "on", "1":
		return true, nil
	case "false", "no", "off", "0":
		return false, nil
	}
	return false, fmt.Errorf("%s = %s: not a boolean (true/false, yes/no, on/off, 1/0)", key, v)
}

func allDigits(s string) bool {
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return false
		}
	}
	return s != ""
}

// decimalFloat reports [+-]?(digits[.digits?]|.digits)([eE][+-]?digits)?:
// the float syntax every SDK accepts.
func decimalFloat(v string) bool {
	if v != "" && (v[0] == '+' || v[0] == '-') {
		v = v[1:]
	}
	mantissa, exponent, hasExp := strings.Cut(strings.ReplaceAll(v, "E", "e"), "e")
	whole, frac, _ := strings.Cut(mantissa, ".")
	if (whole != "" && !allDigits(whole)) || (frac != "" && !allDigits(frac)) || whole+frac == "" {
		return false
	}
	if hasExp {
		if exponent != "" && (exponent[0] == '+' || exponent[0] == '-') {
			exponent = exponent[1:]
		}
		return allDigits(exponent)
	}
	return true
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
