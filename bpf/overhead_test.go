package bpf

import (
	"os"
	"runtime"
	"testing"
	"time"

	"github.com/cilium/ebpf"
	"golang.org/x/sys/unix"
)

// BenchmarkSwitchCost measures what the probes add to context switches:
// two threads of this process, each locked to its OS thread, pass a byte
// back and forth through pipes, so every op is two wake-ups and two
// switches. "probes off" is the kernel alone; "untracked" has the probes
// attached but this process not tracked (what every other process on a
// node pays); "tracked" is a UAP's cost.
//
// On a VM the switch itself varies by more than the probes cost, so the
// kernel's own accounting (BPF stats) is reported too: probe-ns/run is the
// programs' runtime per execution, which is what each switch and wake-up
// on the machine pays.
func BenchmarkSwitchCost(b *testing.B) {
	if os.Geteuid() != 0 {
		b.Skip("eBPF needs root")
	}
	b.Run("probes off", func(b *testing.B) { pingPong(b) })
	stats, err := ebpf.EnableStats(uint32(unix.BPF_STATS_RUN_TIME))
	if err != nil {
		b.Fatalf("BPF stats: %v", err)
	}
	defer stats.Close()
	m := Open(Options{})
	defer m.Close()
	pm, ok := m.(*probeMeter)
	if !ok {
		b.Skipf("no probes: %s", m.Mechanism().Reason)
	}
	b.Run("untracked", func(b *testing.B) { pingPong(b); reportProbeCost(b, pm) })
	if err := m.Track(os.Getpid()); err != nil {
		b.Fatal(err)
	}
	defer m.Forget(os.Getpid())
	b.Run("tracked", func(b *testing.B) { pingPong(b); reportProbeCost(b, pm) })
}

// reportProbeCost reports the probes' runtime per execution since the last
// call, from the kernel's BPF stats.
func reportProbeCost(b *testing.B, pm *probeMeter) {
	var spent time.Duration
	var runs uint64
	for _, p := range pm.coll.Programs {
		st, err := p.Stats()
		if err != nil {
			b.Fatal(err)
		}
		spent += st.Runtime
		runs += st.RunCount
	}
	if runs > 0 {
		b.ReportMetric(float64(spent.Nanoseconds())/float64(runs), "probe-ns/run")
	}
}

func pingPong(b *testing.B) {
	var ab, ba [2]int
	if err := unix.Pipe(ab[:]); err != nil {
		b.Fatal(err)
	}
	if err := unix.Pipe(ba[:]); err != nil {
		b.Fatal(err)
	}
	defer func() {
		for _, fd := range []int{ab[0], ab[1], ba[0], ba[1]} {
			unix.Close(fd)
		}
	}()
	done := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer close(done)
		buf := make([]byte, 1)
		for {
			if n, err := unix.Read(ab[0], buf); n != 1 || err != nil {
				return
			}
			if buf[0] == 0 {
				return
			}
			unix.Write(ba[1], buf)
		}
	}()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	buf := []byte{1}
	b.ResetTimer()
	for range b.N {
		unix.Write(ab[1], buf)
		unix.Read(ba[0], buf)
	}
	b.StopTimer()
	unix.Write(ab[1], []byte{0})
	<-done
}
