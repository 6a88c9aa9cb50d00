// Command uap-echo is the example UAP: a worker process that scdd starts to
// serve a service group from its shared-memory schedule queue. It is what
// the demo, the tests and the benchmarks run, and the model for UAP authors:
// it imports nothing of tpsched but shm (and internal/version, for -version).
//
// Services:
//
//	echo   replies with the request
//	sleep  sleeps the number of milliseconds in the request (decimal text)
//	burn   spins the CPU for the number of microseconds in the request, of wall-clock time
//	cpu    spins until its thread has used the number of microseconds of CPU time in the request
//
// sleep, burn and cpu reply with the request, in which a space may follow
// the number with anything after it.
//
//	fail   returns an application error
//	crash  dies in the middle of the call (a panic), as a broken UAP would
//	pid    replies with the process id (to see which process served a call)
//	call   calls another service through the node (shm.UAP.Call): the
//	       request is "group/service/request"; it replies with that
//	       call's reply, or fails with its error
//
// TPSCHED_ECHO_SLOWDOWN=k (an integer, default 1) makes sleep, burn and cpu
// take k times as long: a benchmark's way to make one node of a cluster
// slower than the others with the same calls.
//
// uap-echo -version prints its version; scdd starts it with no arguments.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/internal/spin"
	"tpsched/internal/version"
	"tpsched/shm"
)

func main() {
	showVersion := flag.Bool("version", false, "print uap-echo's version and exit")
	flag.Parse()
	if *showVersion {
		fmt.Println(version.Line("uap-echo"))
		return
	}
	slowdown := int64(1)
	if v := os.Getenv("TPSCHED_ECHO_SLOWDOWN"); v != "" {
		k, err := strconv.ParseInt(v, 10, 64)
		if err != nil || k < 1 {
			fmt.Fprintf(os.Stderr, "uap-echo: TPSCHED_ECHO_SLOWDOWN=%q: want a whole number >= 1\n", v)
			os.Exit(2)
		}
		slowdown = k
	}
	number := func(req []byte) (int64, error) {
		n, err := parseNumber(req)
		return n * slowdown, err
	}
	srv, err := shm.Attach()
	if err != nil {
		fmt.Fprintln(os.Stderr, "uap-echo:", err)
		os.Exit(2)
	}
	srv.Handle("echo", func(req []byte) ([]byte, error) { return req, nil })
	srv.Handle("sleep", func(req []byte) ([]byte, error) {
		ms, err := number(req)
		if err != nil {
			return nil, err
		}
		time.Sleep(time.Duration(ms) * time.Millisecond)
		return req, nil
	})
	srv.Handle("burn", func(req []byte) ([]byte, error) {
		us, err := number(req)
		if err != nil {
			return nil, err
		}
		spin.Wall(time.Duration(us) * time.Microsecond)
		return req, nil
	})
	srv.Handle("cpu", func(req []byte) ([]byte, error) {
		us, err := number(req)
		if err != nil {
			return nil, err
		}
		burnCPU(time.Duration(us) * time.Microsecond)
		return req, nil
	})
	srv.Handle("fail", func(req []byte) ([]byte, error) {
		return nil, errors.New("failure requested")
	})
	srv.Handle("pid", func(req []byte) ([]byte, error) {
		return strconv.AppendInt(req[:0], int64(os.Getpid()), 10), nil
	})
	srv.Handle("call", func(req []byte) ([]byte, error) {
		group, rest, ok1 := bytes.Cut(req, []byte("/"))
		service, inner, ok2 := bytes.Cut(rest, []byte("/"))
		if !ok1 || !ok2 {
			return nil, fmt.Errorf("want group/service/request, got %.40q", req)
		}
		reply, err := srv.Call(context.Background(), string(group), string(service), inner)
		if err != nil {
			return nil, fmt.Errorf("call %s/%s: %w", group, service, err)
		}
		return reply, nil
	})
	srv.Handle("crash", func(req []byte) ([]byte, error) {
		panic("uap-echo: crash requested")
	})
	if err := srv.Serve(); err != nil {
		fmt.Fprintln(os.Stderr, "uap-echo:", err)
		os.Exit(1)
	}
}

// parseNumber reads the decimal number a request starts with; what follows
// a space is a tag the reply carries back (a test's call id).
func parseNumber(req []byte) (int64, error) {
	text, _, _ := strings.Cut(strings.TrimSpace(string(req)), " ")
	n, err := strconv.ParseInt(text, 10, 64)
	if err != nil || n < 0 {
		return 0, fmt.Errorf("want a non-negative decimal number, got %q", req)
	}
	return n, nil
}

// burnCPU spins until this thread has used d of CPU time: unlike burn
// (spin.Wall), a
// call preempted by other work still costs what it says, which is what a
// benchmark of CPU contention needs.
func burnCPU(d time.Duration) {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var ts unix.Timespec
	_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	end := ts.Nano() + d.Nanoseconds()
	x := uint64(1)
	for ts.Nano() < end {
		for range 1000 {
			x = x*6364136223846793005 + 1442695040888963407
		}
		_ = unix.ClockGettime(unix.CLOCK_THREAD_CPUTIME_ID, &ts)
	}
	sink = x
}

var sink uint64
