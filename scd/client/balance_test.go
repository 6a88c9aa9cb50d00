package client

import (
	"testing"
	"time"
)

func TestLevelCacheRoundRobinExpiryAndLRU(t *testing.T) {
	now := time.Unix(1000, 0)
	lc := newLevelCache(2)
	lc.put("a", []int{3, 4, 5}, 1, now.Add(time.Second))
	var got []int
	for range 4 {
		h, ok := lc.next("a", now)
		if !ok {
			t.Fatal("fresh entry not found")
		}
		got = append(got, h)
	}
	if want := []int{4, 5, 3, 4}; !equal(got, want) {
		t.Errorf("round robin from position 1: %v, want %v", got, want)
	}
	if _, ok := lc.next("a", now.Add(2*time.Second)); ok {
		t.Error("an expired entry was used")
	}
	lc.put("a", []int{1}, 0, now.Add(time.Minute))
	lc.put("b", []int{2}, 0, now.Add(time.Minute))
	lc.next("a", now) // a is now the most recently used
	lc.put("c", []int{3}, 0, now.Add(time.Minute))
	if _, ok := lc.next("b", now); ok {
		t.Error("the least recently used group was kept past dccache entries")
	}
	if _, ok := lc.next("a", now); !ok {
		t.Error("a recently used group was evicted")
	}
	lc.forget("a")
	if _, ok := lc.next("a", now); ok {
		t.Error("a forgotten group is still cached")
	}
}

func equal(a, b []int) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
