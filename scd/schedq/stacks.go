package schedq

// The queue's two containers: the ready processes, a stack per kind
// (readyStacks), and the waiting calls (ring).

// readyStacks are the ready processes by kind, residents first, and which
// slots serve a resident process; of each kind the last to become ready is
// taken first.
type readyStacks struct {
	stacks   [2][]int // by kind: 0 resident, 1 non-resident
	resident []bool   // by slot
}

func newReadyStacks(slots, resident int) readyStacks {
	r := readyStacks{resident: make([]bool, slots)}
	for s := range resident {
		r.resident[s] = true
	}
	// Capacity for every slot in either stack: SetResident may move any
	// slot to either kind, and the stacks must not grow after New.
	r.stacks[0] = make([]int, 0, slots)
	r.stacks[1] = make([]int, 0, slots)
	return r
}

func (r *readyStacks) kind(slot int) int {
	if r.resident[slot] {
		return 0
	}
	return 1
}

// push makes slot ready, the last of its kind.
func (r *readyStacks) push(slot int) {
	k := r.kind(slot)
	r.stacks[k] = append(r.stacks[k], slot)
}

// pop takes a ready process: a resident one first, the last to become
// ready first. -1 if none is ready.
func (r *readyStacks) pop() int {
	for k := range r.stacks {
		if n := len(r.stacks[k]); n > 0 {
			s := r.stacks[k][n-1]
			r.stacks[k] = r.stacks[k][:n-1]
			return s
		}
	}
	return -1
}

// remove takes slot out of its stack.
func (r *readyStacks) remove(slot int) {
	k := r.kind(slot)
	for i, s := range r.stacks[k] {
		if s == slot {
			r.stacks[k] = append(r.stacks[k][:i], r.stacks[k][i+1:]...)
			return
		}
	}
}

func (r *readyStacks) count() int { return len(r.stacks[0]) + len(r.stacks[1]) }

// ring is a FIFO that grows up to limit entries (more by pushFront) and
// never shrinks.
type ring[T any] struct {
	buf   []T
	head  int // index of the first entry
	n     int
	limit int
}

func (r *ring[T]) push(v T) {
	r.grow()
	r.buf[(r.head+r.n)%len(r.buf)] = v
	r.n++
}

// pushFront puts v at the head.
func (r *ring[T]) pushFront(v T) {
	r.grow()
	r.head = (r.head - 1 + len(r.buf)) % len(r.buf)
	r.buf[r.head] = v
	r.n++
}

func (r *ring[T]) grow() {
	if r.n < len(r.buf) {
		return
	}
	size := max(8, 2*len(r.buf))
	if size > r.limit && r.n < r.limit {
		size = r.limit
	}
	size = max(size, r.n+1)
	nb := make([]T, size)
	for i := range r.n {
		nb[i] = r.buf[(r.head+i)%len(r.buf)]
	}
	r.buf, r.head = nb, 0
}

func (r *ring[T]) pop() (T, bool) {
	var zero T
	if r.n == 0 {
		return zero, false
	}
	v := r.buf[r.head]
	r.buf[r.head] = zero
	r.head = (r.head + 1) % len(r.buf)
	r.n--
	return v, true
}
