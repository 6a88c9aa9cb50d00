package schedq

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected output in testdata/ from what the queue does")

// TestScripts runs the scripts in testdata/: each block is a command, a
// "----" line and the expected output, which is what the queue returned
// followed by its state:
//
//	waiting: a b      calls in the queue, head first
//	slots: 0:a 1:r    per slot: - empty, r ready, x busy with call x,
//	                  x* busy with x whose caller was answered, ~ retiring,
//	                  ~x retiring and still holding x
//
// Commands: new queue=N slots=N [resident=N] [refresh], submit CALL
// [deadline=T], ready SLOT, done SLOT, exit SLOT [started], retire SLOT,
// expire NOW, close, flush, stats.
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
	num := func(s string) (int, error) { return strconv.Atoi(s) }
	if cmd == "new" {
		cfg := Config{}
		var err error
		for k, v := range args {
			var n int
			if n, err = num(v); err != nil {
				return nil, err
			}
			switch k {
			case "queue":
				cfg.QueueSize = n
			case "slots":
				cfg.Slots = n
			case "resident":
				cfg.Resident = n
			default:
				return nil, fmt.Errorf("unknown argument %s", k)
			}
		}
		cfg.Refresh = len(pos) > 0 && pos[0] == "refresh"
		*qp = New[string](cfg)
		return nil, nil
	}
	q := *qp
	if q == nil {
		return nil, fmt.Errorf("no queue: start with new")
	}
	slotArg := func() (int, error) {
		if len(pos) < 1 {
			return 0, fmt.Errorf("%s needs a slot", cmd)
		}
		return num(pos[0])
	}
	dispatch := func(d Dispatch[string]) []string {
		if d.Slot < 0 {
			return nil
		}
		return []string{fmt.Sprintf("dispatch %s -> %d", d.Call, d.Slot)}
	}
	switch cmd {
	case "submit":
		deadline := 0
		if v, ok := args["deadline"]; ok {
			var err error
			if deadline, err = num(v); err != nil {
				return nil, err
			}
		}
		d, err := q.Submit(pos[0], int64(deadline))
		switch {
		case err == ErrFull:
			return []string{"refused " + pos[0] + ": full"}, nil
		case err == ErrClosed:
			return []string{"refused " + pos[0] + ": closed"}, nil
		case d.Slot < 0:
			return []string{"wait " + pos[0]}, nil
		}
		return dispatch(d), nil
	case "ready":
		s, err := slotArg()
		if err != nil {
			return nil, err
		}
		return dispatch(q.Ready(s)), nil
	case "done":
		s, err := slotArg()
		if err != nil {
			return nil, err
		}
		c, ok := q.Done(s)
		if !ok {
			return []string{"no call"}, nil
		}
		out := []string{"answer " + c.Call}
		if c.Answered {
			out = []string{"drop reply of " + c.Call + " (answered already)"}
		}
		return append(out, dispatch(c.Next)...), nil
	case "exit":
		s, err := slotArg()
		if err != nil {
			return nil, err
		}
		ex := q.Exited(s, len(pos) > 1 && pos[1] == "started")
		switch {
		case ex.Outcome == Terminated:
			return []string{"terminated " + ex.Call}, nil
		case ex.Outcome == Requeued:
			return append([]string{"requeued " + ex.Call}, dispatch(ex.Next)...), nil
		case ex.Held:
			return []string{"free " + ex.Call + " (answered already)"}, nil
		}
		return []string{"no call"}, nil
	case "retire":
		s, err := slotArg()
		if err != nil {
			return nil, err
		}
		if q.Retire(s) {
			return []string{"still holds a call"}, nil
		}
		return []string{"holds no call"}, nil
	case "expire":
		now, err := slotArg()
		if err != nil {
			return nil, err
		}
		late := q.Expire(int64(now), nil)
		if len(late) == 0 {
			return []string{"nothing late"}, nil
		}
		return []string{"timed out " + strings.Join(late, " ")}, nil
	case "close":
		q.Close()
		return nil, nil
	case "flush":
		out := q.Flush(nil)
		return []string{"flushed " + strings.Join(out, " ")}, nil
	case "stats":
		st := q.Stats()
		return []string{fmt.Sprintf("queued %d processed %d refused %d timed-out %d terminated %d requeued %d waiting %d busy %d in-flight %d",
			st.Queued, st.Processed, st.Refused, st.TimedOut, st.Terminated, st.Requeued, st.Waiting, st.Busy, q.InFlight())}, nil
	}
	return nil, fmt.Errorf("unknown command %q", cmd)
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
		var v string
		switch sl.state {
		case slotEmpty:
			v = "-"
		case slotReady:
			v = "r"
		case slotBusy:
			v = sl.call
		case slotRetiring:
			v = "~"
			if sl.held {
				v += sl.call
			}
		}
		if sl.held && sl.answered {
			v += "*"
		}
		s = append(s, fmt.Sprintf("%d:%s", i, v))
	}
	return []string{"waiting: " + strings.Join(w, " "), "slots: " + strings.Join(s, " ")}
}

// TestNoAllocsOnceGrown: the hot path (submit, done with next, ready)
// allocates nothing once the queue has held queue_size calls.
func TestNoAllocsOnceGrown(t *testing.T) {
	q := New[*int](Config{QueueSize: 64, Slots: 2, Resident: 1})
	c := new(int)
	q.Ready(0)
	q.Ready(1)
	for range 66 {
		if _, err := q.Submit(c, 0); err != nil {
			t.Fatal(err)
		}
	}
	for range 66 {
		q.Done(0)
	}
	allocs := testing.AllocsPerRun(1000, func() {
		if _, err := q.Submit(c, 0); err != nil {
			t.Fatal(err)
		}
		if _, ok := q.Done(1); !ok {
			t.Fatal("slot 1 holds no call")
		}
		q.Expire(0, nil)
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per submit and done", allocs)
	}
}

// FuzzExactlyOnce drives a queue with random events and checks its
// promises: every admitted call is answered exactly once (completed, timed
// out, terminated or flushed), a refused call only when queue_size calls
// wait, and no call is handed to two processes.
func FuzzExactlyOnce(f *testing.F) {
	f.Add([]byte{0, 0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2})
	f.Add([]byte{1, 1, 1, 1, 1, 9, 17, 25, 2, 10, 3, 11, 4, 12, 6, 14})
	f.Fuzz(func(t *testing.T, ops []byte) {
		const slots, size = 3, 4
		q := New[int](Config{QueueSize: size, Slots: slots, Resident: 1})
		answered := map[int]int{} // call -> answers
		admitted := map[int]bool{}
		holder := map[int]int{} // call -> slot it is handed to
		taken := [slots]bool{}  // the process in slot took its call
		next, now := 0, int64(0)
		dispatched := func(d Dispatch[int]) {
			if d.Slot < 0 {
				return
			}
			if s, ok := holder[d.Call]; ok {
				t.Fatalf("call %d handed to slot %d while slot %d holds it", d.Call, d.Slot, s)
			}
			holder[d.Call] = d.Slot
			taken[d.Slot] = false
		}
		answer := func(c int) { answered[c]++ }
		for _, op := range ops {
			s := int(op>>3) % slots
			switch op % 8 {
			case 0, 1:
				next++
				waiting := q.Waiting()
				d, err := q.Submit(next, now+int64(op%5)*3)
				if err == ErrFull {
					if waiting < size {
						t.Fatalf("call %d refused with %d of %d waiting", next, waiting, size)
					}
					continue
				}
				admitted[next] = true
				dispatched(d)
			case 2:
				dispatched(q.Ready(s))
			case 3:
				taken[s] = true
			case 4:
				c, ok := q.Done(s)
				if ok {
					delete(holder, c.Call)
					if !c.Answered {
						answer(c.Call)
					}
					dispatched(c.Next)
				}
			case 5:
				ex := q.Exited(s, taken[s])
				if ex.Held {
					delete(holder, ex.Call)
				}
				if ex.Outcome == Terminated {
					answer(ex.Call)
				}
				dispatched(ex.Next)
			case 6:
				now += int64(op >> 4)
				for _, c := range q.Expire(now, nil) {
					answer(c)
				}
			case 7:
				q.Retire(s)
			}
		}
		for _, c := range q.Flush(nil) {
			answer(c)
		}
		for s := range slots { // the processes end; what they held is answered
			ex := q.Exited(s, true)
			if ex.Outcome == Terminated {
				answer(ex.Call)
			}
			if ex.Outcome == Requeued {
				t.Fatalf("a started call %d was requeued", ex.Call)
			}
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
