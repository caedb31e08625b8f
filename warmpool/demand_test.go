package warmpool

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestSizeKeysSharesTheBudgetByDemand(t *testing.T) {
	const gib = 1 << 30
	cases := []struct {
		name     string
		keys     []keyDemand
		budget   int64
		perKey   int
		maxSlots int
		want     map[string]int
	}{
		{"demand within budget", []keyDemand{{"a", 3, gib}, {"b", 1, gib}}, 8 * gib, 8, 8, map[string]int{"a": 3, "b": 1}},
		{"budget caps the total", []keyDemand{{"a", 5, gib}}, 2 * gib, 8, 8, map[string]int{"a": 2}},
		{"more demand, more slots", []keyDemand{{"a", 1, gib}, {"b", 6, gib}}, 4 * gib, 8, 8, map[string]int{"a": 1, "b": 3}},
		{"every wanted key gets one first", []keyDemand{{"a", 9, gib}, {"b", 1, gib}, {"c", 1, gib}}, 3 * gib, 8, 8, map[string]int{"a": 1, "b": 1, "c": 1}},
		{"perKey caps a key", []keyDemand{{"a", 9, gib}}, 100 * gib, 4, 8, map[string]int{"a": 4}},
		{"maxSlots caps them all", []keyDemand{{"a", 9, gib}, {"b", 9, gib}}, 100 * gib, 8, 5, map[string]int{"a": 3, "b": 2}},
		{"a big key does not starve small ones", []keyDemand{{"big", 4, 3 * gib}, {"small", 4, gib / 2}}, 4 * gib, 8, 8, map[string]int{"big": 1, "small": 2}},
		{"nothing fits", []keyDemand{{"a", 2, 2 * gib}}, gib, 8, 8, map[string]int{}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := sizeKeys(c.keys, c.budget, c.perKey, c.maxSlots)
			for k, v := range got {
				if v == 0 {
					delete(got, k)
				}
			}
			assert.Equal(t, c.want, got)
		})
	}
}

func TestRecentClaims(t *testing.T) {
	now := time.Now()
	claims := []time.Time{now.Add(-3 * time.Minute), now.Add(-61 * time.Second), now.Add(-59 * time.Second), now.Add(-time.Second)}
	kept, n := recentClaims(claims, now, time.Minute)
	assert.Equal(t, 2, n)
	assert.Equal(t, claims[2:], kept)
}

func TestSlotCost(t *testing.T) {
	var tm Template
	assert.Equal(t, int64(minSlotMemory), slotCost(tm), "no limit: counted at the floor")
	tm.Policy.MemoryBytes = 1 << 30
	assert.Equal(t, int64(1<<30), slotCost(tm))
}
