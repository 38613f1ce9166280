//go:build wasip1

package nf

// admissionWays is how many slots a flow's hash may take.
const admissionWays = 4

type admissionSlot struct {
	hash   uint64
	counts [2]uint32
}

// Admission tells which flow directions have proved long enough to
// offload: a count of each direction's packets in the instance's own
// memory. An entry costs the host a request, an install and an end, which
// a flow that ends a few packets later does not repay where a call is
// cheap; Admit is true once a direction has carried After packets the NF
// would have offloaded, as flow caches admit only flows that have proved
// long. The counts live in a table of slots flows, four ways per hash (a
// new flow takes the place of the one with the fewest packets there): a
// count lost to another flow, another worker or a restart only delays the
// entry. Nothing here changes a verdict.
type Admission struct {
	After uint32
	sets  uint64
	slots []admissionSlot
}

// NewAdmission admits a direction at its after-th packet (0 and 1: at
// once, with no table), counting at most slots flows (rounded up to a
// power of two, at least 4, at most 2^20).
func NewAdmission(after uint32, slots int) *Admission {
	a := &Admission{After: after}
	if after <= 1 {
		return a
	}
	slots = min(max(slots, admissionWays), 1<<20)
	n := admissionWays
	for n < slots {
		n <<= 1
	}
	a.slots = make([]admissionSlot, n)
	a.sets = uint64(n / admissionWays)
	return a
}

func (a *Admission) set(hash uint64) []admissionSlot {
	at := int(hash&(a.sets-1)) * admissionWays
	return a.slots[at : at+admissionWays]
}

// Admit counts p in its flow's direction (FlagReverse); true once that
// direction has carried After counted packets.
func (a *Admission) Admit(p *Packet) bool {
	if a == nil || a.sets == 0 {
		return true
	}
	set := a.set(p.FlowHash)
	var slot *admissionSlot
	for k := range set {
		if set[k].hash == p.FlowHash {
			slot = &set[k]
			break
		}
	}
	if slot == nil {
		// The place of the flow with the fewest packets.
		slot = &set[0]
		for k := 1; k < len(set); k++ {
			if uint64(set[k].counts[0])+uint64(set[k].counts[1]) < uint64(slot.counts[0])+uint64(slot.counts[1]) {
				slot = &set[k]
			}
		}
		*slot = admissionSlot{hash: p.FlowHash}
	}
	n := &slot.counts[p.Flags&FlagReverse]
	if *n < ^uint32(0) {
		*n++
	}
	return *n >= a.After
}

// Forget forgets the counts of p's flow (a new connection on its 5-tuple).
func (a *Admission) Forget(p *Packet) {
	if a == nil || a.sets == 0 {
		return
	}
	set := a.set(p.FlowHash)
	for k := range set {
		if set[k].hash == p.FlowHash {
			set[k].counts = [2]uint32{}
		}
	}
}
