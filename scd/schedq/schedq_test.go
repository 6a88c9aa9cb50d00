package schedq

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/ from what the queue does")

// TestScripts runs the scripts in testdata/: each block is a command, a
// "----" line and the expected output: what the event returned, the
// actions it queued (hand CALL -> SLOT, revoke SLOT), then the state:
//
//	waiting: a b      calls in the queue, head first
//	slots: 0:a+b 1:r  per slot: - empty, r ready, a busy with a, a+b busy
//	                  with a and b prefetched (x! once its process is known
//	                  to have taken x), x* a call whose caller was answered,
//	                  ~ retiring, L lent to a lane
//
// Commands: new queue=N slots=N [resident=N] [depth=N] [refresh], submit
// CALL [deadline=T], ready SLOT, done SLOT, exit SLOT [taken=N] (the calls
// it had taken), retire SLOT, lend [SLOT] (to a lane: any ready slot, or
// that one), return SLOT, revoked SLOT, notrevoked SLOT, resident
// SLOT, nonresident SLOT (chprc changed its kind), undelivered SLOT n=N
// (its transport refused the last N calls handed over), expire NOW,
// close, flush, stats. Run with -rewrite to regenerate the outputs,
// then read every change.
func TestScripts(t *testing.T) {
	files, err := filepath.Glob("testdata/*.txt")
	if err != nil || len(files) == 0 {
		t.Fatalf("no scripts in testdata/ (%v)", err)
	}
	for _, file := range files {
		t.Run(filepath.Base(file), func(t *testing.T) { runScript(t, file) })
	}
}

type block struct {
	line     int
	cmd      string
	expected string
}

func parseScript(t *testing.T, file string) (blocks []block, comments map[int][]string) {
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	comments = map[int][]string{}
	for i := 0; i < len(lines); i++ {
		l := lines[i]
		if strings.TrimSpace(l) == "" {
			continue
		}
		if strings.HasPrefix(l, "#") {
			comments[len(blocks)] = append(comments[len(blocks)], l)
			continue
		}
		b := block{line: i + 1, cmd: l}
		if i+1 >= len(lines) || lines[i+1] != "----" {
			t.Fatalf("%s:%d: command without a ---- line", file, i+1)
		}
		i += 2
		var out []string
		for ; i < len(lines) && lines[i] != "" && !strings.HasPrefix(lines[i], "#"); i++ {
			out = append(out, lines[i])
		}
		i-- // the line that ended the output is the outer loop's next
		b.expected = strings.Join(out, "\n")
		blocks = append(blocks, b)
	}
	return blocks, comments
}

func runScript(t *testing.T, file string) {
	blocks, comments := parseScript(t, file)
	var q *Queue[string]
	var sb strings.Builder
	for i := range blocks {
		b := &blocks[i]
		got, err := step(&q, b.cmd)
		if err != nil {
			t.Fatalf("%s:%d: %s: %v", file, b.line, b.cmd, err)
		}
		if q != nil && !strings.HasPrefix(b.cmd, "stats") {
			got = append(got, describe(q)...)
		}
		out := strings.Join(got, "\n")
		if *rewrite {
			b.expected = out
		} else if out != b.expected {
			t.Errorf("%s:%d: %s\n got:\n%s\nwant:\n%s", file, b.line, b.cmd, out, b.expected)
		}
	}
	if !*rewrite {
		return
	}
	for i, b := range blocks {
		if i > 0 {
			sb.WriteString("\n")
		}
		for _, c := range comments[i] {
			sb.WriteString(c + "\n")
		}
		fmt.Fprintf(&sb, "%s\n----\n%s\n", b.cmd, b.expected)
	}
	if err := os.WriteFile(file, []byte(sb.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

func step(qp **Queue[string], line string) ([]string, error) {
	f := strings.Fields(line)
	cmd, args := f[0], map[string]string{}
	var pos []string
	for _, a := range f[1:] {
		if k, v, ok := strings.Cut(a, "="); ok {
			args[k] = v
		} else {
			pos = append(pos, a)
		}
	}
	has := func(word string) bool { return slices.Contains(pos, word) }
	if cmd == "new" {
		cfg := Config{Refresh: has("refresh")}
		for k, v := range args {
			n, err := strconv.Atoi(v)
			if err != nil {
				return nil, err
			}
			switch k {
			case "queue":
				cfg.QueueSize = n
			case "slots":
				cfg.Slots = n
			case "resident":
				cfg.Resident = n
			case "depth":
				cfg.Depth = n
			default:
				return nil, fmt.Errorf("unknown argument %s", k)
			}
		}
		*qp = New[string](cfg)
		return nil, nil
	}
	q := *qp
	if q == nil {
		return nil, fmt.Errorf("no queue: start with new")
	}
	num, taken, count := 0, 0, 0
	for k, p := range map[string]*int{"taken": &taken, "n": &count} {
		if v, ok := args[k]; ok {
			var err error
			if *p, err = strconv.Atoi(v); err != nil {
				return nil, err
			}
		}
	}
	if len(pos) > 0 && cmd != "submit" {
		var err error
		if num, err = strconv.Atoi(pos[0]); err != nil {
			return nil, fmt.Errorf("%s: %v", cmd, err)
		}
	}
	var out []string
	switch cmd {
	case "submit":
		deadline := 0
		if v, ok := args["deadline"]; ok {
			var err error
			if deadline, err = strconv.Atoi(v); err != nil {
				return nil, err
			}
		}
		switch err := q.Submit(pos[0], int64(deadline)); err {
		case ErrFull:
			out = append(out, "refused "+pos[0]+": full")
		case ErrClosed:
			out = append(out, "refused "+pos[0]+": closed")
		}
	case "ready":
		q.Ready(num)
	case "done":
		c, ok := q.Done(num)
		switch {
		case !ok:
			out = append(out, "no call")
		case c.Answered:
			out = append(out, "drop reply of "+c.Call+" (answered already)")
		default:
			out = append(out, "answer "+c.Call)
		}
	case "exit":
		for _, e := range q.Exited(num, taken, nil) {
			out = append(out, map[Outcome]string{Free: "free ", Terminated: "terminated ", Requeued: "requeued "}[e.Outcome]+e.Call)
		}
		if len(out) == 0 {
			out = append(out, "no call")
		}
	case "undelivered":
		for _, e := range q.Undelivered(num, count, nil) {
			out = append(out, map[Outcome]string{Free: "free ", Terminated: "terminated "}[e.Outcome]+e.Call)
		}
		if len(out) == 0 {
			out = append(out, "no call")
		}
	case "retire":
		if q.Retire(num) {
			out = append(out, "still holds a call")
		} else {
			out = append(out, "holds no call")
		}
	case "lend":
		if s := q.Lend(func(s int) bool { return len(pos) == 0 || s == num }); s < 0 {
			out = append(out, "nothing to lend")
		} else {
			out = append(out, fmt.Sprintf("lent %d", s))
		}
	case "return":
		q.Return(num)
	case "revoked":
		if c, free := q.Revoked(num); free {
			out = append(out, "free "+c+" (answered already)")
		}
	case "notrevoked":
		q.NotRevoked(num)
	case "resident", "nonresident":
		q.SetResident(num, cmd == "resident")
	case "expire":
		late := q.Expire(int64(num), nil)
		if len(late) == 0 {
			out = append(out, "nothing late")
		} else {
			out = append(out, "timed out "+strings.Join(late, " "))
		}
	case "close":
		q.Close()
	case "flush":
		out = append(out, "flushed "+strings.Join(q.Flush(nil), " "))
	case "stats":
		st := q.Stats()
		return []string{fmt.Sprintf("queued %d processed %d refused %d timed-out %d terminated %d requeued %d waiting %d busy %d in-flight %d",
			st.Queued, st.Processed, st.Refused, st.TimedOut, st.Terminated, st.Requeued, st.Waiting, st.Busy, q.InFlight())}, nil
	default:
		return nil, fmt.Errorf("unknown command %q", cmd)
	}
	for _, a := range q.TakeActions(nil) {
		if a.Kind == Hand {
			out = append(out, fmt.Sprintf("hand %s -> %d", a.Call, a.Slot))
		} else {
			out = append(out, fmt.Sprintf("revoke %d", a.Slot))
		}
	}
	return out, nil
}

func describe(q *Queue[string]) []string {
	var w []string
	for i := range q.wait.n {
		w = append(w, q.wait.buf[(q.wait.head+i)%len(q.wait.buf)].call)
	}
	if len(w) == 0 {
		w = []string{"-"}
	}
	var s []string
	for i := range q.slots {
		sl := &q.slots[i]
		v := map[slotState]string{slotEmpty: "-", slotReady: "r", slotBusy: "", slotRetiring: "~", slotLent: "L"}[sl.state]
		if sl.lent && sl.state == slotRetiring {
			v = "~L"
		}
		for j, h := range sl.calls {
			if j > 0 {
				v += "+"
			}
			v += h.call
			if j < sl.taken {
				v += "!"
			}
			if h.answered {
				v += "*"
			}
		}
		s = append(s, fmt.Sprintf("%d:%s", i, v))
	}
	return []string{"waiting: " + strings.Join(w, " "), "slots: " + strings.Join(s, " ")}
}

// TestNoAllocsOnceGrown: the hot path (submit, done with its next call,
// actions) allocates nothing once the queue has held queue_size calls.
func TestNoAllocsOnceGrown(t *testing.T) {
	q := New[*int](Config{QueueSize: 64, Slots: 2, Resident: 1, Depth: 2})
	c := new(int)
	acts := make([]Action[*int], 0, 8)
	q.Ready(0)
	q.Ready(1)
	for range 66 { // 2 running, 2 prefetched, 62 in the queue: full
		if err := q.Submit(c, 0); err != nil {
			t.Fatal(err)
		}
	}
	if err := q.Submit(c, 0); err != ErrFull {
		t.Fatalf("submit to a full queue: %v", err)
	}
	for q.Waiting() > 2 {
		q.Done(0)
		q.Done(1)
	}
	acts = q.TakeActions(acts[:0])
	allocs := testing.AllocsPerRun(1000, func() {
		if err := q.Submit(c, 0); err != nil {
			t.Fatal(err)
		}
		if _, ok := q.Done(1); !ok {
			t.Fatal("slot 1 holds no call")
		}
		acts = q.TakeActions(acts[:0])
		q.Expire(0, nil)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per submit and done", allocs)
	}
}

// FuzzExactlyOnce drives a queue with random events and checks its
// promises: every admitted call is answered exactly once (completed, timed
// out, terminated or flushed), a call is refused only when queue_size
// calls wait, and no call is with two processes at once.
func FuzzExactlyOnce(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2})
	f.Add([]byte{1, 1, 1, 1, 1, 9, 17, 25, 2, 10, 3, 11, 4, 12, 6, 14, 0, 0, 0, 4, 7})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const slots, size = 3, 4
		q := New[int](Config{QueueSize: size, Slots: slots, Resident: 1, Depth: 1 + len(ops)%4})
		answered := map[int]int{} // call -> answers
		admitted := map[int]bool{}
		with := map[int]int{}  // call -> slot it was handed to
		held := [slots][]int{} // what each process was handed, oldest first
		taken := [slots]int{}  // how many of them, from the oldest, the process took
		lent := [slots]bool{}  // lent to a lane: the queue must hand it nothing
		next, now := 0, int64(0)
		answer := func(c int) { answered[c]++ }
		// act carries out the actions as scd's group does. With fail, the
		// transport refuses every call handed over: the group hands that
		// slot nothing more in the batch, skips its revokes, and then
		// reports the calls it did not deliver (Undelivered).
		act := func(rng byte, fail bool) {
			for {
				acts := q.TakeActions(nil)
				if len(acts) == 0 {
					return
				}
				var refused [slots]int
				var failed [slots]bool
				for _, a := range acts {
					s := a.Slot
					if a.Kind == Hand {
						if lent[s] {
							t.Fatalf("call %d handed to slot %d, which is lent to a lane", a.Call, s)
						}
						if o, ok := with[a.Call]; ok {
							t.Fatalf("call %d handed to slot %d while slot %d has it", a.Call, s, o)
						}
						if fail || failed[s] {
							failed[s] = true
							refused[s]++
							continue
						}
						with[a.Call] = s
						held[s] = append(held[s], a.Call)
						continue
					}
					if failed[s] {
						continue
					}
					if len(held[s]) < 2 {
						t.Fatalf("revoke of slot %d, which holds %v", s, held[s])
					}
					if rng%3 == 0 || taken[s] == len(held[s]) { // the process took it first
						taken[s] = len(held[s])
						q.NotRevoked(s)
						continue
					}
					c := held[s][len(held[s])-1]
					held[s] = held[s][:len(held[s])-1]
					delete(with, c)
					if got, _ := q.Revoked(s); got != c {
						t.Fatalf("revoked %d, the queue says %d", c, got)
					}
				}
				for s := range slots {
					if !failed[s] {
						continue
					}
					if n := q.Held(s) - len(held[s]); n != refused[s] {
						t.Fatalf("slot %d: the queue holds %d calls the process was not given, %d were refused", s, n, refused[s])
					}
					for _, e := range q.Undelivered(s, refused[s], nil) {
						if _, ok := with[e.Call]; ok {
							t.Fatalf("undelivered call %d is held by slot %d", e.Call, with[e.Call])
						}
						if e.Outcome == Terminated {
							answer(e.Call)
						}
					}
				}
			}
		}
		for _, op := range ops {
			s := int(op>>3) % slots
			switch op % 8 {
			case 0, 1:
				next++
				waiting := q.Waiting()
				err := q.Submit(next, now+int64(op%5)*3)
				if err == ErrFull {
					if waiting < size {
						t.Fatalf("call %d refused with %d of %d waiting", next, waiting, size)
					}
					continue
				}
				if err == nil {
					admitted[next] = true
				}
			case 2:
				if op&0x40 == 0 {
					q.Ready(s)
				} else if got := q.Lend(func(x int) bool { return x == s }); got >= 0 {
					if got != s || len(held[s]) != 0 {
						t.Fatalf("lent slot %d (asked for %d), which holds %v", got, s, held[s])
					}
					lent[s] = true
				}
			case 3: // the process takes one more of its calls
				taken[s] = min(taken[s]+1+int(op>>6), len(held[s]))
			case 4:
				c, ok := q.Done(s)
				if ok {
					if len(held[s]) == 0 || held[s][0] != c.Call {
						t.Fatalf("slot %d done with %d, it holds %v", s, c.Call, held[s])
					}
					delete(with, c.Call)
					held[s] = held[s][1:]
					taken[s] = max(taken[s]-1, 0)
					if !c.Answered {
						answer(c.Call)
					}
				}
			case 5:
				for _, e := range q.Exited(s, taken[s], nil) {
					delete(with, e.Call)
					if e.Outcome == Terminated {
						answer(e.Call)
					}
				}
				held[s], taken[s], lent[s] = nil, 0, false
			case 6:
				now += int64(op >> 4)
				for _, c := range q.Expire(now, nil) {
					answer(c)
				}
			case 7:
				switch {
				case op&0x80 != 0: // chprc: the slot changes kind
					q.SetResident(s, op&0x40 != 0)
				case op&0x40 != 0: // its lane ends
					q.Return(s)
					lent[s] = false
				default:
					q.Retire(s)
				}
			}
			// Now and then the transport refuses what a submit or an
			// attach hands over.
			act(op, (op%8 == 1 || op%8 == 2) && op&0xc0 == 0xc0)
		}
		for _, c := range q.Flush(nil) {
			answer(c)
		}
		for s := range slots { // the processes end, having taken what they held
			for _, e := range q.Exited(s, len(held[s]), nil) {
				if e.Outcome == Terminated {
					answer(e.Call)
				}
				if e.Outcome == Requeued {
					t.Fatalf("a taken call %d was requeued", e.Call)
				}
			}
			act(0, false)
		}
		for _, c := range q.Flush(nil) {
			answer(c)
		}
		for c := range admitted {
			if answered[c] != 1 {
				t.Fatalf("call %d answered %d times", c, answered[c])
			}
		}
		if q.InFlight() != 0 {
			t.Fatalf("%d calls still in flight", q.InFlight())
		}
	})
}
