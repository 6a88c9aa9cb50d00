package bpf

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/testenv"
)

// The test binary doubles as the measured process: with this variable set
// it waits for a line on stdin, burns burnFor of CPU, says "done" and waits
// for stdin to close.
const childEnv = "TPSCHED_BPF_TEST_BURN"

const burnFor = 400 * time.Millisecond

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) == "threads" {
		threadsChild()
		os.Exit(0)
	}
	if os.Getenv(childEnv) != "" {
		in := bufio.NewReader(os.Stdin)
		in.ReadString('\n')
		burnCPU(burnFor)
		os.Stdout.WriteString("done\n")
		io.Copy(io.Discard, in)
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// threadsChild is the measured process of TestProcMeterWaitOutlivesThreads:
// at the first line on stdin it starts more threads than there are CPUs,
// each burning burnFor/4 of CPU, so that they wait on the run queues; it
// says "burned" when all have, and at the next line lets the threads end
// (a goroutine that returns locked to its thread ends the thread), says
// "done", and waits for stdin to close.
func threadsChild() {
	in := bufio.NewReader(os.Stdin)
	in.ReadString('\n')
	var burned, ended sync.WaitGroup
	end := make(chan struct{})
	for range 2*runtime.NumCPU() + 2 {
		burned.Add(1)
		ended.Add(1)
		go func() {
			defer ended.Done()
			runtime.LockOSThread() // never unlocked: the thread ends with the goroutine
			var ru unix.Rusage
			for x := 0; ; x++ {
				if x%100000 == 0 {
					unix.Getrusage(unix.RUSAGE_THREAD, &ru)
					if time.Duration(ru.Utime.Nano()+ru.Stime.Nano()) >= burnFor/4 {
						break
					}
				}
			}
			burned.Done()
			<-end
		}()
	}
	burned.Wait()
	os.Stdout.WriteString("burned\n")
	in.ReadString('\n')
	close(end)
	ended.Wait()
	os.Stdout.WriteString("done\n")
	io.Copy(io.Discard, in)
}

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

// needProbes skips a test that needs eBPF when this is not root, unless
// the run must have them (testenv: CI=true or TPSCHED_REQUIRE_BPF=1).
func needProbes(t *testing.T) {
	t.Helper()
	testenv.RequireBPF(t)
}

type burner struct {
	cmd  *exec.Cmd
	in   io.WriteCloser
	out  *bufio.Reader
	done bool
}

func startBurner(t *testing.T) *burner {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=1")
	in, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	b := &burner{cmd: cmd, in: in, out: bufio.NewReader(out)}
	t.Cleanup(func() { b.cmd.Process.Kill(); b.cmd.Wait() })
	return b
}

func (b *burner) start(t *testing.T) {
	if _, err := b.in.Write([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
}

func (b *burner) wait(t *testing.T) {
	t.Helper()
	timer := time.AfterFunc(30*time.Second, func() { b.cmd.Process.Kill() })
	defer timer.Stop()
	if line, err := b.out.ReadString('\n'); err != nil || line != "done\n" {
		t.Fatalf("burner: %q, %v", line, err)
	}
}

// procCPU is utime + stime of pid from /proc.
func procCPU(t *testing.T, pid int) time.Duration {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Fatal(err)
	}
	ticks, err := statCPUTicks(b)
	if err != nil {
		t.Fatal(err)
	}
	return time.Duration(ticks) * clockTick
}

func TestProbesMeasureOnCPUTimeAsProcDoes(t *testing.T) {
	needProbes(t)
	for _, mech := range []string{TPBTF, RawTP, Tracepoint} {
		t.Run(mech, func(t *testing.T) {
			m := Open(Options{Force: mech})
			defer m.Close()
			if got := m.Mechanism(); got.Name != mech || !got.Histogram {
				t.Fatalf("mechanism %+v, want %s: %s", got, mech, got.Reason)
			}
			b := startBurner(t)
			if err := m.Track(b.cmd.Process.Pid); err != nil {
				t.Fatal(err)
			}
			untracked := startBurner(t)
			b.start(t)
			untracked.start(t)
			b.wait(t)
			untracked.wait(t)
			// The burner now sleeps on stdin, so its last slice is counted.
			time.Sleep(20 * time.Millisecond)
			got := m.Read(b.cmd.Process.Pid)
			want := procCPU(t, b.cmd.Process.Pid)
			if want < burnFor*9/10 {
				t.Fatalf("/proc says %v, the burner burned at least %v", want, burnFor)
			}
			if diff := got.OnCPU - want; diff < -want/10 || diff > want/10 {
				t.Errorf("eBPF on-CPU %v, /proc %v: more than 10%% apart", got.OnCPU, want)
			} else {
				t.Logf("eBPF on-CPU %v, /proc %v, %d run-queue waits", got.OnCPU, want, got.Waits)
			}
			var sum uint64
			for _, n := range got.Hist {
				sum += n
			}
			if sum != got.Waits || got.Waits == 0 {
				t.Errorf("histogram holds %d waits, Waits = %d; want equal and > 0", sum, got.Waits)
			}
			if u := m.Read(untracked.cmd.Process.Pid); u != (Usage{}) {
				t.Errorf("an untracked process was measured: %+v", u)
			}
			// Forget gives what was measured until then: Read's figure, and
			// what the burner's runtime ran since (it sleeps on stdin, but a
			// busy machine may run its last slices only now).
			if f := m.Forget(b.cmd.Process.Pid); f.OnCPU < got.OnCPU || f.OnCPU-got.OnCPU > want/10 {
				t.Errorf("Forget gave %v, Read %v before it", f.OnCPU, got.OnCPU)
			}
			if u := m.Read(b.cmd.Process.Pid); u != (Usage{}) {
				t.Errorf("a forgotten process is still measured: %+v", u)
			}
		})
	}
}

// More runnable burners than CPUs must wait on the run queue, and the
// probes must see it.
func TestProbesSeeRunQueueWait(t *testing.T) {
	needProbes(t)
	m := Open(Options{})
	defer m.Close()
	if m.Mechanism().Name == Proc {
		t.Fatalf("no probes: %s", m.Mechanism().Reason)
	}
	var bs []*burner
	for range 2*cpus() + 1 {
		b := startBurner(t)
		if err := m.Track(b.cmd.Process.Pid); err != nil {
			t.Fatal(err)
		}
		bs = append(bs, b)
	}
	for _, b := range bs {
		b.start(t)
	}
	var total Usage
	for _, b := range bs {
		b.wait(t)
	}
	time.Sleep(20 * time.Millisecond)
	for _, b := range bs {
		total.Add(m.Read(b.cmd.Process.Pid))
	}
	// Each burner needs burnFor of CPU; with more of them than CPUs the
	// others wait meanwhile: at least (n - cpus) x burnFor in all.
	minWait := time.Duration(len(bs)-cpus()) * burnFor / 2
	if total.Wait < minWait {
		t.Errorf("run-queue wait %v for %d burners on %d CPUs; want at least %v", total.Wait, len(bs), cpus(), minWait)
	}
	if total.OnCPU < time.Duration(len(bs))*burnFor*9/10 {
		t.Errorf("on-CPU %v for %d burners of %v", total.OnCPU, len(bs), burnFor)
	}
}

func cpus() int { return runtime.NumCPU() }

func TestProcMeterReadsProc(t *testing.T) {
	m := Open(Options{Force: Proc})
	if m.Mechanism().Name != Proc || m.Mechanism().Histogram {
		t.Fatalf("mechanism %+v", m.Mechanism())
	}
	b := startBurner(t)
	pid := b.cmd.Process.Pid
	if u := m.Read(pid); u != (Usage{}) {
		t.Fatalf("untracked pid read %+v", u)
	}
	m.Track(pid)
	b.start(t)
	b.wait(t)
	// The burner's runtime may still take a tick after it said it burned:
	// /proc read before and after bracket the meter's reading.
	before := procCPU(t, pid)
	got := m.Read(pid)
	if after := procCPU(t, pid); got.OnCPU < before || got.OnCPU > after {
		t.Errorf("on-CPU %v, /proc says %v before the reading and %v after", got.OnCPU, before, after)
	}
	b.in.Close()
	b.cmd.Wait()
	if f := m.Forget(pid); f.OnCPU != got.OnCPU {
		t.Errorf("after exit Forget gave %v; the last reading was %v", f.OnCPU, got.OnCPU)
	}
}

// startThreadsChild starts this test binary as the "threads" child: it burns
// on more threads than CPUs when told "go" (and says "burned"), and ends
// them when told "end" (and says "done"). expect fails the test on any
// other line, or none within 30 s.
func startThreadsChild(t *testing.T) (pid int, tell func(string), expect func(string)) {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), childEnv+"=threads")
	in, err := cmd.StdinPipe()
	must(t, err)
	outPipe, err := cmd.StdoutPipe()
	must(t, err)
	must(t, cmd.Start())
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	out := bufio.NewReader(outPipe)
	tell = func(what string) {
		t.Helper()
		_, err := in.Write([]byte(what + "\n"))
		must(t, err)
	}
	expect = func(want string) {
		t.Helper()
		timer := time.AfterFunc(30*time.Second, func() { cmd.Process.Kill() })
		defer timer.Stop()
		if line, err := out.ReadString('\n'); err != nil || line != want+"\n" {
			t.Fatalf("child: %q, %v; want %q", line, err, want)
		}
	}
	return cmd.Process.Pid, tell, expect
}

// TestProcMeterWaitOutlivesThreads: the /proc meter sums the run-queue
// wait of the threads it finds in /proc/<pid>/task, and a thread that ended
// is not there: its wait dropped out of the process's total, which went
// back (a counter, tpsched_group_runqueue_wait_seconds_total, that
// decreases; a CPU guard window with negative wait).
func TestProcMeterWaitOutlivesThreads(t *testing.T) {
	m := Open(Options{Force: Proc})
	if !m.Mechanism().Waits {
		t.Skipf("no run-queue wait here: %s", m.Mechanism().Reason)
	}
	pid, tell, expect := startThreadsChild(t)
	must(t, m.Track(pid))
	tell("go")
	expect("burned")
	during := m.Read(pid)
	if during.Wait <= 0 {
		t.Fatalf("%d threads burned on %d CPUs and waited %v", 2*runtime.NumCPU()+2, runtime.NumCPU(), during.Wait)
	}
	tell("end")
	expect("done")
	time.Sleep(20 * time.Millisecond) // the ended threads leave /proc/<pid>/task
	if after := m.Read(pid); after.Wait < during.Wait || after.OnCPU < during.OnCPU {
		t.Errorf("after the threads ended the process read %v on CPU, %v waiting; before, %v and %v", after.OnCPU, after.Wait, during.OnCPU, during.Wait)
	}
	if f := m.Forget(pid); f.Wait < during.Wait {
		t.Errorf("Forget gave %v waiting; before the threads ended, %v", f.Wait, during.Wait)
	}
}

func TestStatCPUTicks(t *testing.T) {
	for _, tc := range []struct {
		line string
		want uint64
		ok   bool
	}{
		{"1234 (uap) S 1 1234 1234 0 -1 4194560 100 0 0 0 25 17 0 0 20 0 4 0 5 0 0", 42, true},
		{"1234 (a) b) (c) R 1 1234 1234 0 -1 4194560 100 0 0 0 3 4 0 0 20 0 4 0 5 0 0", 7, true},
		{"1234 uap S 1", 0, false},
		{"1234 (uap) S 1 2 3", 0, false},
		{"1234 (uap) S 1 1234 1234 0 -1 4194560 100 0 0 0 x 17 0", 0, false},
	} {
		got, err := statCPUTicks([]byte(tc.line))
		if (err == nil) != tc.ok || got != tc.want {
			t.Errorf("statCPUTicks(%q) = %d, %v; want %d ok=%v", tc.line, got, err, tc.want, tc.ok)
		}
	}
}

// TestEachMechanismLoadsOnlyItsMaps: a mechanism's collection holds the
// maps its programs use and no other, so the classic tracepoint's does not
// create the run-queue map (Linux 5.5) and loads on older kernels.
func TestEachMechanismLoadsOnlyItsMaps(t *testing.T) {
	for name, progs := range programs {
		spec, err := loadSched()
		if err != nil {
			t.Fatal(err)
		}
		keepOnly(spec, append(progs[:], freeProgram))
		if len(spec.Programs) != 4 {
			t.Errorf("%s: %d programs left", name, len(spec.Programs))
		}
		_, rq := spec.Maps[schedMapRunqueue]
		if rq != (name != Tracepoint) {
			t.Errorf("%s: run-queue map in the collection = %v", name, rq)
		}
		if _, ok := spec.Maps[schedMapProcs]; !ok {
			t.Errorf("%s: the procs map was dropped", name)
		}
	}
}

// threadState is sched.c's struct thread_state, the threads map's value.
type threadState struct {
	Tgid        uint32
	_           uint32
	RuntimeSeen uint64
	QueuedSince uint64
}

// forcedProbes opens the probes of mechanism mech, closed when the test
// ends; it fails the test where they do not load.
func forcedProbes(t *testing.T, mech string) *probeMeter {
	t.Helper()
	m := Open(Options{Force: mech})
	t.Cleanup(func() { m.Close() })
	pm, ok := m.(*probeMeter)
	if !ok {
		t.Fatalf("mechanism %+v, want %s", m.Mechanism(), mech)
	}
	return pm
}

// TestProbesTakeAReusedThreadID: the threads map kept a thread's entry
// after the thread ended (now it goes when the task is freed, a grace
// period later), so once ids wrapped, a new UAP's thread could find the
// entry of an ended process's thread with the same id. The probes took
// that entry as the thread's own and added its CPU time to the ended
// process, which nobody tracks: a group whose UAPs were restarted for long
// enough read no CPU at all. Here every thread of the burner starts with
// such an entry, as after a wrap.
func TestProbesTakeAReusedThreadID(t *testing.T) {
	needProbes(t)
	for _, mech := range []string{TPBTF, RawTP, Tracepoint} {
		t.Run(mech, func(t *testing.T) {
			pm := forcedProbes(t, mech)
			m := Meter(pm)
			b := startBurner(t)
			pid := b.cmd.Process.Pid
			tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
			if err != nil {
				t.Fatal(err)
			}
			const ended = 1<<22 + 1 // above any pid_max: a process long gone
			for _, task := range tasks {
				tid, err := strconv.Atoi(task.Name())
				if err != nil {
					t.Fatal(err)
				}
				stale := threadState{Tgid: ended, RuntimeSeen: uint64(time.Second)}
				if err := pm.coll.Maps["threads"].Put(uint32(tid), stale); err != nil {
					t.Fatal(err)
				}
			}
			if err := m.Track(pid); err != nil {
				t.Fatal(err)
			}
			b.start(t)
			b.wait(t)
			time.Sleep(20 * time.Millisecond) // it sleeps on stdin: its last slice is counted
			got, want := m.Read(pid).OnCPU, procCPU(t, pid)
			if want < burnFor*9/10 {
				t.Fatalf("/proc says %v, the burner burned at least %v", want, burnFor)
			}
			// A thread of the burner that ran before it was tracked and not
			// since keeps its stale entry; what it ran is small.
			if got < want*8/10 {
				t.Errorf("eBPF on-CPU %v, /proc %v: the burner's threads were counted to an ended process", got, want)
			}
		})
	}
}

// TestProbesDropEndedThreads: a thread's entry in the threads map goes
// when the thread ends. Entries stayed until the LRU (65536) evicted them,
// and with a pid_max above that (systemd sets 4194304) UAPs that start and
// end threads filled it: then a live thread that had not run for a while
// was evicted, and when it ran again it counted from 0, its whole CPU time
// added a second time. The ended threads' time still counts, to their last
// switch-out.
func TestProbesDropEndedThreads(t *testing.T) {
	needProbes(t)
	for _, mech := range []string{TPBTF, RawTP, Tracepoint} {
		t.Run(mech, func(t *testing.T) {
			pm := forcedProbes(t, mech)
			m := Meter(pm)
			pid, tell, expect := startThreadsChild(t)
			must(t, m.Track(pid))
			tell("go")
			expect("burned")
			entries := func() int {
				n := 0
				var tid uint32
				var st threadState
				it := pm.coll.Maps["threads"].Iterate()
				for it.Next(&tid, &st) {
					if st.Tgid == uint32(pid) {
						n++
					}
				}
				must(t, it.Err())
				return n
			}
			burners := 2*runtime.NumCPU() + 2
			if n := entries(); n < burners {
				t.Fatalf("%d entries of the process while its %d burners run", n, burners)
			}
			tell("end")
			expect("done")
			// The entries go a grace period after the threads end (RCU's:
			// seconds on a loaded machine; without the free's program,
			// never).
			var live, n int
			for end := time.Now().Add(20 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
				tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
				must(t, err)
				if live, n = len(tasks), entries(); n <= live {
					break
				}
			}
			if n > live {
				t.Errorf("%d entries of the process in the threads map; it has %d threads, %d ended", n, live, burners)
			}
			time.Sleep(20 * time.Millisecond) // it sleeps on stdin: its last slice is counted
			got, want := m.Read(pid).OnCPU, procCPU(t, pid)
			if diff := got - want; diff < -want/10 || diff > want/10 {
				t.Errorf("eBPF on-CPU %v, /proc %v: more than 10%% apart", got, want)
			}
		})
	}
}

// ProcStarted reads a process's start from /proc: this test process
// started before now, and not long before (the package's tests are short).
func TestProcStarted(t *testing.T) {
	started, err := ProcStarted(os.Getpid())
	if err != nil || started.After(time.Now()) || time.Since(started) > 10*time.Minute {
		t.Errorf("this process started at %v (%v), %v ago", started, err, time.Since(started))
	}
	if _, err := ProcStarted(1 << 30); err == nil {
		t.Error("a start time for a pid that cannot exist")
	}
}
