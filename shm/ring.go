package shm

import (
	"sync/atomic"
	"unsafe"
)

// ring is a bounded MPMC queue in shared memory after Dmitry Vyukov's design:
// every entry starts with a sequence number; head and tail are positions that
// only grow (uint64, never wrap in practice) and live on their own cache lines
// in the header. The capacity n is exact (positions are taken modulo n, so it
// needs no power of two).
//
// For position pos, entry pos%n has
//
//	seq == 2*pos        free: a producer may reserve it
//	seq == 2*pos+1      published: a consumer may take it
//	seq == 2*(pos+n)    taken and released: free for position pos+n
//
// (Vyukov's original uses pos, pos+1 and pos+n, which collide when n is 1;
// doubling keeps every capacity exact, Slots 1 included.)
//
// A producer or consumer that may die (a UAP) announces the position it is
// about to claim in its control block before the CAS, so that Reclaim can
// finish or undo a half-done step (see Segment.Reclaim).
type ring struct {
	head   *atomic.Uint64
	tail   *atomic.Uint64
	ents   unsafe.Pointer
	stride uintptr
	n      uint64
}

func (r *ring) entry(pos uint64) unsafe.Pointer {
	return unsafe.Add(r.ents, uintptr(pos%r.n)*r.stride)
}

func (r *ring) seq(pos uint64) *atomic.Uint64 {
	return (*atomic.Uint64)(r.entry(pos))
}

// reserve claims the next free entry for a producer. It reports false when the
// ring is full. claim, when not nil, holds pos+1 while the CAS is attempted.
func (r *ring) reserve(claim *atomic.Uint64) (uint64, bool) {
	for {
		pos := r.tail.Load()
		d := int64(r.seq(pos).Load() - freeSeq(pos))
		switch {
		case d == 0:
			if claim != nil {
				claim.Store(pos + 1)
			}
			if r.tail.CompareAndSwap(pos, pos+1) {
				return pos, true
			}
			if claim != nil {
				claim.Store(0)
			}
		case d < 0:
			return 0, false
		}
	}
}

// publish makes a reserved entry visible to consumers.
func (r *ring) publish(pos uint64) { r.seq(pos).Store(pubSeq(pos)) }

func freeSeq(pos uint64) uint64 { return 2 * pos }
func pubSeq(pos uint64) uint64  { return 2*pos + 1 }

// take claims the oldest published entry for a consumer. It reports false
// when nothing is published at the head. claim, when not nil, holds pos+1
// while the CAS is attempted; on success it is left set (the caller clears it
// after release).
func (r *ring) take(claim *atomic.Uint64) (uint64, bool) {
	for {
		pos := r.head.Load()
		d := int64(r.seq(pos).Load() - pubSeq(pos))
		switch {
		case d == 0:
			if claim != nil {
				claim.Store(pos + 1)
			}
			if r.head.CompareAndSwap(pos, pos+1) {
				return pos, true
			}
			if claim != nil {
				claim.Store(0)
			}
		case d < 0:
			return 0, false
		}
	}
}

// release frees a taken entry for the producers' next lap.
func (r *ring) release(pos uint64) { r.seq(pos).Store(freeSeq(pos + r.n)) }

// ready reports whether an entry is published at the head (a cheap check for
// spin loops).
func (r *ring) ready() bool {
	pos := r.head.Load()
	return r.seq(pos).Load() == pubSeq(pos)
}

// depth is the number of reserved or published entries not yet taken.
func (r *ring) depth() int {
	h := r.head.Load()
	t := r.tail.Load()
	if t < h {
		return 0
	}
	return int(t - h)
}
