package warmpool

import (
	"cmp"
	"slices"
	"time"
)

// DefaultDemandWindow is Config.DemandWindow's default.
const DefaultDemandWindow = time.Minute

// minSlotMemory is what a slot of a template without a memory limit is
// counted as against Config.MemoryBudget.
const minSlotMemory = 64 << 20

// keyDemand is one key's recent demand, for sizing.
type keyDemand struct {
	key string
	// demand is how many slots the key wants: its claims in the demand
	// window, at least 1 while it is wanted.
	demand int
	// cost is the memory one slot of the key holds.
	cost int64
}

// slotCost is the memory a slot of t holds against the budget: the run's
// memory limit, which the parked container keeps until a run claims it.
func slotCost(t Template) int64 {
	return max(t.Policy.MemoryBytes, minSlotMemory)
}

// recentClaims counts the claim times within window before now and drops
// the older ones from the slice it returns.
func recentClaims(claims []time.Time, now time.Time, window time.Duration) ([]time.Time, int) {
	i := 0
	for i < len(claims) && now.Sub(claims[i]) > window {
		i++
	}
	claims = claims[i:]
	return claims, len(claims)
}

// sizeKeys shares budget bytes of slots among the keys by their demand:
// a slot at a time, the most demanded key first, round after round, each
// key up to min(demand, perKey), all keys up to maxSlots and budget. A
// key's share is how many slots (ready and filling) it keeps.
func sizeKeys(keys []keyDemand, budget int64, perKey, maxSlots int) map[string]int {
	keys = slices.Clone(keys)
	slices.SortFunc(keys, func(a, b keyDemand) int {
		if c := cmp.Compare(b.demand, a.demand); c != 0 {
			return c
		}
		return cmp.Compare(a.key, b.key)
	})
	share := make(map[string]int, len(keys))
	var used int64
	total := 0
	for grew := true; grew && total < maxSlots; {
		grew = false
		for _, k := range keys {
			if share[k.key] >= min(k.demand, perKey) || total >= maxSlots || used+k.cost > budget {
				continue
			}
			share[k.key]++
			used += k.cost
			total++
			grew = true
		}
	}
	return share
}
