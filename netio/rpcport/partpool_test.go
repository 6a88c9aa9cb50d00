package rpcport

import "testing"

func TestPartClass(t *testing.T) {
	prev := 0
	for n := 1; n <= partClassMax; n += 1 + n/7 {
		idx, size, ok := partClass(n)
		if !ok || size < n || size > max(512, n+n/4) {
			t.Fatalf("partClass(%d) = %d, %d, %v: want a size from n to n+n/4", n, idx, size, ok)
		}
		if size < prev {
			t.Fatalf("partClass(%d) = %d, below the class of a smaller n (%d)", n, size, prev)
		}
		prev = size
		// A class size is its own class.
		if idx2, size2, _ := partClass(size); idx2 != idx || size2 != size {
			t.Fatalf("partClass(%d) = %d, %d; partClass(%d) = %d, %d", n, idx, size, size, idx2, size2)
		}
	}
	if _, _, ok := partClass(partClassMax + 1); ok {
		t.Error("a buffer above partClassMax is pooled")
	}
	b := getPart(10, 5000)
	if len(b) != 10 || cap(b) < 5000 {
		t.Fatalf("getPart(10, 5000): len %d cap %d", len(b), cap(b))
	}
	putPart(b)
}
