//go:build wasip1

// Package nf writes Sluice network functions in Go.
//
// An NF is a type implementing NetworkFunction, registered from the main
// package's init with Export. The host calls Init once per instance with
// the tenant's configuration and Process once per batch of packets, never
// once per packet. Inside Process, Batch gives packet views, per-flow
// state (including changes made earlier in the same batch) and setters for
// verdicts, rewrites and state; none of them calls the host. Return an
// error to refuse a configuration or fail a batch: its message goes to the
// host, which applies the NF's failure policy.
//
// Built by `sluice nf build` with Go's wasip1 port (GOOS=wasip1,
// -buildmode=c-shared) and wrapped into a sluice:nf@0.6.0 component.
package nf

import (
	"errors"
	"fmt"
)

// Info is what Init tells the host.
type Info struct {
	// Hand in per-flow state with every batch.
	WantsFlowState bool
	// Idle time after which the host forgets a flow's state; 0: 120 s.
	FlowIdleTimeoutNs uint64
}

// Stateless is the Info of an NF without per-flow state.
func Stateless() Info { return Info{} }

// WithFlowState is the Info of an NF keeping per-flow state.
func WithFlowState(idleTimeoutNs uint64) Info {
	return Info{WantsFlowState: true, FlowIdleTimeoutNs: idleTimeoutNs}
}

// NetworkFunction is what an NF implements.
type NetworkFunction interface {
	Init(config []byte) (Info, error)
	Process(b *Batch) error
}

// Expirer is implemented by NFs with tables declared notify-expired.
type Expirer interface {
	Expired(table uint32, entries []byte) error
}

var registered NetworkFunction
var initialized bool

// Export registers the NF; call it from the main package's init.
func Export(nf NetworkFunction) { registered = nf }

func callInit(config []byte) (info Info, err error) {
	defer recoverTo(&err)
	if registered == nil {
		return Info{}, errors.New("no NF registered: call nf.Export from the main package's init")
	}
	info, err = registered.Init(config)
	initialized = err == nil
	return info, err
}

func callProcess(b *Batch) (err error) {
	defer recoverTo(&err)
	if !initialized {
		return errors.New("process called before a successful init")
	}
	return registered.Process(b)
}

func callExpired(table uint32, entries []byte) (err error) {
	defer recoverTo(&err)
	if e, ok := registered.(Expirer); ok && initialized {
		return e.Expired(table, entries)
	}
	return nil
}

// recoverTo turns a panic in the NF into an error for this call: the host
// then applies the failure policy, as for a returned error.
func recoverTo(err *error) {
	if r := recover(); r != nil {
		*err = fmt.Errorf("panic: %v", r)
	}
}

// Verdicts.
const Drop uint32 = 0

// Forward sends the packet out of port (0: the default output).
func Forward(port uint16) uint32 { return 1<<16 | uint32(port) }

// Label sends the packet to the chain branch selected by value.
func Label(value uint16) uint32 { return 2<<16 | uint32(value) }

// Log and event levels.
const (
	LevelDebug uint8 = iota
	LevelInfo
	LevelWarn
	LevelError
)

// Log writes a line to the host log.
func Log(level uint8, message string) {
	p, n := strPtr(message)
	hostLog(uint32(level), p, n)
}
