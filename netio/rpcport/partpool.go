package rpcport

import (
	"math/bits"
	"sync"
)

// Partial-frame buffers are reused. Under the partial-frame attack (32
// connections each sending most of an 8 MiB frame, closed by the budget
// and back) the event loop spent 18% of its time zeroing new buffers
// (make, and the page faults of fresh memory), more in the garbage
// collector, for buffers that lived a fraction of a second. A buffer a
// frame no longer needs (it grew, was handed on, or its connection closed)
// goes to a pool of its size class and serves the next frame unzeroed.
//
// Classes: four per power of two from 512 bytes (512, 640, 768, 896,
// 1024, ...), so a buffer is at most a quarter larger than asked for; the
// budget is charged its whole capacity. sync.Pool lets the garbage
// collector take back what is not reused.

const (
	partMinShift  = 9 // the smallest class: 512 bytes
	partSubShift  = 2 // four classes per power of two
	partClassMax  = 64 << 20
	partClassMany = (bits.UintSize - partMinShift) << partSubShift
)

var partPools [partClassMany]sync.Pool // of *[]byte

// partClass is the index and size of the smallest class of at least n
// bytes; ok is false above partClassMax (such buffers are not pooled).
func partClass(n int) (idx, size int, ok bool) {
	if n <= 1<<partMinShift {
		return 0, 1 << partMinShift, true
	}
	if n > partClassMax {
		return 0, n, false
	}
	shift := bits.Len(uint(n-1)) - 1 // 2^shift < n <= 2^(shift+1)
	step := 1 << (shift - partSubShift)
	sub := (n - 1<<shift + step - 1) / step // 1..4 steps above 2^shift
	size = 1<<shift + sub*step
	idx = (shift-partMinShift)<<partSubShift + sub
	return idx, size, true
}

// getPart returns a buffer of length n and capacity the class of at
// least size (size >= n); its bytes are not zeroed.
func getPart(n, size int) []byte {
	idx, cs, ok := partClass(size)
	if !ok {
		return make([]byte, n, size)
	}
	if p, _ := partPools[idx].Get().(*[]byte); p != nil {
		return (*p)[:n]
	}
	return make([]byte, n, cs)
}

// putPart gives a buffer from getPart back for another frame; others
// (not of a class size) are left to the garbage collector.
func putPart(b []byte) {
	if cap(b) == 0 {
		return
	}
	idx, cs, ok := partClass(cap(b))
	if !ok || cs != cap(b) {
		return
	}
	b = b[:0]
	partPools[idx].Put(&b)
}
