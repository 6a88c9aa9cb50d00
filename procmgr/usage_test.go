package procmgr

import (
	"io"
	"log/slog"
	"os"
	"syscall"
	"testing"
	"time"

	"tpsched/bpf"
	"tpsched/internal/testenv"
)

// burnFor is how much CPU a "burn" child uses before it reports.
const burnFor = 200 * time.Millisecond

func burnCPU(d time.Duration) {
	var ru syscall.Rusage
	for x := 0; ; x++ {
		if x%100000 == 0 {
			syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
			if time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) >= d {
				return
			}
		}
	}
}

// A server's usage counts its running processes and keeps what ended ones
// used, with whichever meter is live.
func TestUsageCountsRunningAndEndedProcesses(t *testing.T) {
	mechs := []string{bpf.Proc}
	if os.Geteuid() == 0 {
		mechs = append(mechs, bpf.TPBTF)
	} else if req := testenv.Required(); req != "" {
		t.Fatalf("%s but this is not root: the eBPF meter cannot be tested", req)
	}
	for _, mech := range mechs {
		t.Run(mech, func(t *testing.T) {
			meter := bpf.Open(bpf.Options{Force: mech})
			t.Cleanup(func() { meter.Close() }) // after the processes are reaped
			if meter.Mechanism().Name != mech {
				t.Fatalf("meter %+v", meter.Mechanism())
			}
			m := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CPUParent: uniqueParent(), Meter: meter})
			t.Cleanup(m.Close)
			dir := t.TempDir()
			r, _ := testPipe(t)
			exits := newExitLog()
			srv := startServer(t, m, uapSpec("burn", dir, 1), &hooks{file: r, exited: exits.hook})
			first := readReport(t, dir, 0, 0)
			// /proc counts in 10 ms ticks.
			if u := srv.Usage(); u.OnCPU < burnFor-10*time.Millisecond {
				t.Fatalf("usage %v after the process burned %v", u.OnCPU, burnFor)
			}
			// Per process too, for scdctl prc.
			p := srv.Processes()[0]
			if cpu := time.Duration(p.CPUSeconds * float64(time.Second)); cpu < burnFor-10*time.Millisecond {
				t.Fatalf("process %d shows %v of CPU after it burned %v", p.PID, cpu, burnFor)
			}
			victim := p.PID
			if err := syscall.Kill(victim, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			exits.next(t)
			readReport(t, dir, 0, victim)
			// The eBPF meter counts a slice on CPU when it ends: the second
			// process's last one ends just after its report, so look for a
			// while before judging.
			want, end := 2*(burnFor-10*time.Millisecond), time.Now().Add(5*time.Second)
			for srv.Usage().OnCPU < want && time.Now().Before(end) {
				time.Sleep(10 * time.Millisecond)
			}
			if u := srv.Usage(); u.OnCPU < want {
				t.Errorf("usage %v after two processes burned %v each (first pid %s)", u.OnCPU, burnFor, first["pid"])
			}
		})
	}
}

// A process that ends is read once more before it is reaped: its
// /proc/<pid>/stat is there until then, with all it used. It was read after
// the reap, when the /proc meter found nothing and gave what it had last
// read (the scaler reads once a second): a process that burned and ended
// between two reads counted for nothing. (Reaped, its pid may also be
// another process's by the time it is read.)
func TestUsageKeepsWhatAnEndedProcessUsedSinceTheLastRead(t *testing.T) {
	mechs := []string{bpf.Proc}
	if os.Geteuid() == 0 {
		mechs = append(mechs, bpf.TPBTF)
	}
	for _, mech := range mechs {
		t.Run(mech, func(t *testing.T) {
			meter := bpf.Open(bpf.Options{Force: mech})
			t.Cleanup(func() { meter.Close() })
			if meter.Mechanism().Name != mech {
				t.Fatalf("meter %+v", meter.Mechanism())
			}
			m := New(Options{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), CPUParent: uniqueParent(), Meter: meter})
			t.Cleanup(m.Close)
			dir := t.TempDir()
			exits := newExitLog()
			srv := startServer(t, m, uapSpec("burnexit", dir, 1), &hooks{exited: exits.hook})
			e := exits.next(t) // it burned and exited; the one started after it sleeps
			if e.err != nil {
				t.Fatalf("the burner ended with %v", e.err)
			}
			// /proc counts in 10 ms ticks.
			if u := srv.Usage(); u.OnCPU < burnFor-10*time.Millisecond {
				t.Errorf("usage %v after a process burned %v and ended", u.OnCPU, burnFor)
			}
		})
	}
}
