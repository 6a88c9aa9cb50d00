package bpf

import (
	"runtime"
	"testing"
	"time"
)

// With more runnable threads than CPUs, some run queue holds more than
// the task it runs, and RunQueues sees it; they are the tp_btf and raw_tp
// probes' (the classic tracepoint gives no task pointer, /proc none).
func TestRunQueuesSeeWaitingTasks(t *testing.T) {
	needProbes(t)
	for _, mech := range []string{TPBTF, RawTP, Tracepoint, Proc} {
		t.Run(mech, func(t *testing.T) {
			m := Open(Options{Force: mech})
			defer m.Close()
			rq := m.RunQueues()
			if mech == Tracepoint || mech == Proc {
				if rq != nil || m.Mechanism().RunQueues {
					t.Fatalf("%s: run queues %v, mechanism says %v; want none", mech, rq, m.Mechanism().RunQueues)
				}
				return
			}
			if m.Mechanism().Name != mech {
				t.Fatalf("%s did not load: %s", mech, m.Mechanism().Reason)
			}
			if rq == nil || !m.Mechanism().RunQueues {
				t.Fatalf("%s: no run queues", mech)
			}
			stop := make(chan struct{})
			defer close(stop)
			for range 2*runtime.NumCPU() + 1 {
				go func() {
					runtime.LockOSThread()
					for {
						select {
						case <-stop:
							return
						default:
						}
					}
				}()
			}
			deadline := time.Now().Add(5 * time.Second)
			for !rq.Waiting() {
				if time.Now().After(deadline) {
					t.Fatalf("%d spinning threads on %d CPUs, and no run queue ever held more than one task", 2*runtime.NumCPU()+1, runtime.NumCPU())
				}
				time.Sleep(time.Millisecond)
			}
			total := 0
			for cpu := range rq.cpus {
				total += rq.Len(cpu)
			}
			if total < runtime.NumCPU() {
				t.Errorf("run queues hold %d tasks in all while %d threads spin on %d CPUs", total, 2*runtime.NumCPU()+1, runtime.NumCPU())
			}
		})
	}
}
