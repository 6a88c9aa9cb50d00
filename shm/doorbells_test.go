package shm

import (
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// One set of doorbells serves many groups: a ring of a process of either
// wakes the one reader and counts on that process.
func TestDoorbellsOfTwoGroups(t *testing.T) {
	d, err := NewDoorbells()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	var ps [2]*Proc
	for i, name := range []string{"a", "b"} {
		g, err := d.NewGroup(name, 64, 1, testMailboxes)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { g.Unmap() })
		if ps[i], err = g.NewProc(0); err != nil {
			t.Fatal(err)
		}
	}
	// Not in Go's netpoller: os.NewFile registers only non-blocking
	// descriptors there, and a ring of one woke the runtime's poller
	// thread beside the reader.
	for i, p := range ps {
		fl, err := unix.FcntlInt(p.bell.Fd(), unix.F_GETFL, 0)
		if err != nil || fl&unix.O_NONBLOCK != 0 {
			t.Fatalf("doorbell %d: flags %#x, %v: want a blocking eventfd", i, fl, err)
		}
	}

	start := time.Now()
	if d.Wait(30 * time.Millisecond) {
		t.Error("Wait with no ring says something ended it")
	}
	if took := time.Since(start); took < 25*time.Millisecond {
		t.Errorf("Wait with no ring returned after %v, want about 30ms", took)
	}
	for i, p := range ps {
		if r := p.Rings(); r != 0 {
			t.Fatalf("no ring yet, process %d has %d", i, r)
		}
	}

	ring(int(ps[1].bell.Fd()))
	start = time.Now()
	if !d.Wait(5 * time.Second) {
		t.Error("Wait ended by a ring says it timed out")
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("a ring of group b's process woke the reader after %v", took)
	}
	if a, b := ps[0].Rings(), ps[1].Rings(); a != 0 || b != 1 {
		t.Errorf("rings after one of group b's process: a %d, b %d; want 0, 1", a, b)
	}
}

// A Wait nothing ends lasts its whole timeout, however long: the
// scheduler's idle dispatcher asks for up to half a second, and a cut to
// the UAPs' futex bound (maxSleep) made it look at every process's area
// ten times a second on a quiet node. A busy machine only makes the wait
// longer.
func TestDoorbellsWaitLastsItsTimeout(t *testing.T) {
	d, _ := oneProcess(t)
	timeout := 3 * maxSleep
	start := time.Now()
	if d.Wait(timeout) {
		t.Error("Wait with no ring says something ended it")
	}
	if took := time.Since(start); took < timeout-timeout/10 {
		t.Errorf("Wait(%v) with no ring returned after %v", timeout, took)
	}
}

// Interrupt ends a Wait under way from another goroutine, or the next one
// when none is: how the scheduler's Close stops a dispatcher whose idle
// waits are long. It counts as no process's ring.
func TestDoorbellsInterrupt(t *testing.T) {
	d, p := oneProcess(t)
	for _, during := range []bool{true, false} {
		if during {
			go func() { time.Sleep(50 * time.Millisecond); d.Interrupt() }()
		} else {
			d.Interrupt()
		}
		start := time.Now()
		if !d.Wait(30 * time.Second) {
			t.Errorf("interrupted (during the wait: %v): Wait says it timed out", during)
		}
		if took := time.Since(start); took > 10*time.Second {
			t.Errorf("interrupted (during the wait: %v): Wait returned after %v", during, took)
		}
	}
	if r := p.Rings(); r != 0 {
		t.Errorf("Interrupt counted %d ring(s) on a process", r)
	}
}

// oneProcess makes doorbells with one group of one process.
func oneProcess(t *testing.T) (*Doorbells, *Proc) {
	t.Helper()
	d, err := NewDoorbells()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	g, err := d.NewGroup("a", 64, 1, testMailboxes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Unmap() })
	p, err := g.NewProc(0)
	if err != nil {
		t.Fatal(err)
	}
	return d, p
}

// A reader whose SpinWhile says a task waits for a CPU does not spin, and
// still wakes for a ring.
func TestDoorbellsSpinWhile(t *testing.T) {
	d, p := oneProcess(t)
	asked := 0
	d.SpinWhile(func() bool { asked++; return false })
	ring(int(p.bell.Fd()))
	d.Wait(5 * time.Second)
	if asked == 0 {
		t.Error("Wait did not ask SpinWhile's func before spinning")
	}
	if r := p.Rings(); r != 1 {
		t.Errorf("rings %d after one, want 1: the ring woke no sleep", r)
	}
}

// A reader whose group closed, or whose epoll instance is gone, sleeps in
// Wait as before: it returned at once, and the dispatcher's loop spun a
// core from the node's stop until its Close (issue 29 item 7). Judged by
// the number of Waits in 300ms, which a busy machine only lowers: a
// sleeping reader makes about 3 of 100ms, a spinning one thousands.
func TestDoorbellsSleepAfterClose(t *testing.T) {
	d, err := NewDoorbells()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.Close() })
	g, err := d.NewGroup("a", 64, 1, testMailboxes)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { g.Unmap() })
	if _, err := g.NewProc(0); err != nil {
		t.Fatal(err)
	}
	waits := func(d *Doorbells) int {
		n := 0
		for start := time.Now(); time.Since(start) < 300*time.Millisecond; n++ {
			d.Wait(100 * time.Millisecond)
		}
		return n
	}
	g.Close()
	if n := waits(d); n > 30 {
		t.Errorf("a closed group: %d Waits of 100ms in 300ms, want a few: Wait does not sleep", n)
	}
	// Doorbells of no group (an unmapped group's page is gone, and
	// nothing Waits on it), closed.
	gone, err := NewDoorbells()
	if err != nil {
		t.Fatal(err)
	}
	if err := gone.Close(); err != nil {
		t.Fatal(err)
	}
	if n := waits(gone); n > 30 {
		t.Errorf("closed doorbells: %d Waits of 100ms in 300ms, want a few: Wait does not sleep", n)
	}
}
