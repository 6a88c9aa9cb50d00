package procmgr

import (
	"testing"
	"time"
)

// A server whose output stays over the rate has its dropping said twice:
// once when it begins and once, with the count, when the output fits the
// rate again. Each line a token lets through meanwhile is logged, and
// nothing more: a steady flood made three records of each (the line,
// "dropped N" and "over the rate" again).
func TestOutputDropsAreSaidOncePerFlood(t *testing.T) {
	b := newOutputBook(100, 10)
	now := b.last
	var logged, starts, summaries, dropped uint64
	line := func() {
		ok, n, first := b.take(now)
		if ok {
			logged++
		}
		if first {
			starts++
		}
		if n > 0 {
			summaries++
			dropped += n
		}
	}
	// Ten seconds of 1000 lines a second, ten times the rate.
	for range 10000 {
		now = now.Add(time.Millisecond)
		line()
	}
	if starts != 1 || summaries != 0 {
		t.Errorf("during the flood: dropping said to begin %d times, summed %d times; want 1 and 0", starts, summaries)
	}
	if logged < 1000 || logged > 1020 {
		t.Errorf("%d lines logged in 10 s at 100 a second (burst 10)", logged)
	}
	// Then a line a second: the first ends the flood and says its count.
	for range 3 {
		now = now.Add(time.Second)
		line()
	}
	st := b.read()
	if starts != 1 || summaries != 1 || dropped != st.Dropped || st.Lines != logged || st.Lines+st.Dropped != 10003 {
		t.Errorf("after the flood: begun %d, summed %d (%d lines); stats %+v; want 1, 1, every dropped line", starts, summaries, dropped, st)
	}
	if n := b.flush(); n != 0 {
		t.Errorf("flush: %d lines not said", n)
	}
}
