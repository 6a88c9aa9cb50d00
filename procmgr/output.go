package procmgr

import (
	"bufio"
	"bytes"
	"errors"
	"os"
	"sync"
	"time"
)

// A UAP's stdout and stderr are a pipe of its own, not scdd's log file: it
// can neither write scdd's log lines nor seek, truncate or change the
// flags of scdd's descriptors. scdd copies each line into its log as an
// attribute of an "uap output" record (quoted by the log handler, so a UAP
// cannot forge a record), with the server and the pid, within a rate per
// server; the lines beyond are dropped and counted (Output), and a record
// says how many when the server's output fits the rate again.

const (
	defaultOutputRate  = 100  // lines per second, per server
	defaultOutputBurst = 1000 // lines at once
	// maxOutputLine is the longest line copied whole; the rest of a longer
	// one is dropped (the record says "cut").
	maxOutputLine = 4096
	// While a server's output is over the rate, the reader of each of its
	// processes' pipes reads at most skipChunk bytes every skipPause and
	// counts the lines in them as dropped, until a token is due: a process
	// that writes faster (tens of MB a second) waits on its full pipe.
	// Read and dropped line by line as fast as the process wrote, one
	// process printing in a loop (/usr/bin/yes) cost scdd a CPU. The pause
	// is short enough that a chatty but honest process is not slowed.
	skipPause = 2 * time.Millisecond
	skipChunk = 64 << 10
	// dropQuiet: a time of dropping lines ends with the first line logged
	// this long after the last drop.
	dropQuiet = time.Second
)

// OutputStats count what a server's processes wrote to stdout and stderr.
type OutputStats struct {
	Lines   uint64 `json:"lines"`   // lines copied into the log
	Dropped uint64 `json:"dropped"` // lines dropped over the rate
}

// outputBook is a server's token bucket for its processes' output lines.
type outputBook struct {
	rate, burst float64

	mu     sync.Mutex
	tokens float64
	last   time.Time
	// dropping: lines are being dropped, said when it began; it ends when
	// a line is logged dropQuiet after the last drop (the output fits the
	// rate again), and pending, the lines dropped since, are said then. A
	// line let through by a token amid a flood does not end it: under a
	// steady flood that made three records of every line the rate let
	// through (the line, "dropped N" and "over the rate").
	dropping bool
	lastDrop time.Time
	pending  uint64
	stats    OutputStats
}

func newOutputBook(rate, burst int) *outputBook {
	return &outputBook{rate: float64(rate), burst: float64(burst), tokens: float64(burst), last: time.Now()}
}

// take reports whether a line may be logged now, and, when this line ends
// a time of dropping, how many were dropped in it (to be reported first);
// first says that this line is the first one dropped since the output last
// fitted the rate.
func (b *outputBook) take(now time.Time) (ok bool, dropped uint64, first bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.tokens = min(b.burst, b.tokens+now.Sub(b.last).Seconds()*b.rate)
	b.last = now
	if b.tokens < 1 {
		b.pending++
		b.stats.Dropped++
		first = !b.dropping
		b.dropping, b.lastDrop = true, now
		return false, 0, first
	}
	b.tokens--
	b.stats.Lines++
	if b.dropping && now.Sub(b.lastDrop) >= dropQuiet {
		b.dropping = false
		dropped, b.pending = b.pending, 0
	}
	return true, dropped, false
}

// ready reports whether a line would be logged now.
func (b *outputBook) ready(now time.Time) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.tokens+now.Sub(b.last).Seconds()*b.rate >= 1
}

// drop counts n lines dropped without a look at the rate: the output is
// over it (skipOutput).
func (b *outputBook) drop(now time.Time, n uint64) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.lastDrop = now
	b.pending += n
	b.stats.Dropped += n
	b.dropping = true
}

// flush returns the drops not yet reported.
func (b *outputBook) flush() uint64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	n := b.pending
	b.pending, b.dropping = 0, false
	return n
}

func (b *outputBook) read() OutputStats {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.stats
}

// Output counts what the server's processes wrote to stdout and stderr.
func (s *Server) Output() OutputStats { return s.output.read() }

// copyOutput copies the lines of one process's output pipe into the log
// until every holder of the write end (the process and whatever inherited
// it) has closed it or died.
func (s *Server) copyOutput(r *os.File, pid int) {
	defer r.Close()
	br := bufio.NewReaderSize(r, maxOutputLine)
	cut := false // the rest of a line longer than maxOutputLine: skip it
	var skip []byte
	for {
		chunk, err := br.ReadSlice('\n')
		more := err == nil || errors.Is(err, bufio.ErrBufferFull)
		if len(chunk) > 0 {
			full := errors.Is(err, bufio.ErrBufferFull)
			if cut {
				cut = full
			} else {
				line := bytes.TrimRight(chunk, "\r\n")
				cut = full
				if !s.logOutput(pid, string(line), full) && more {
					if skip == nil {
						skip = make([]byte, skipChunk)
					}
					cut, more = s.skipOutput(br, skip, full)
				}
			}
		}
		if !more {
			break
		}
	}
	if n := s.output.flush(); n > 0 {
		s.m.log.Warn("uap output dropped over the rate", "server", s.spec.Server, "lines", n,
			"rate", s.output.rate)
	}
}

// skipOutput reads and drops the output in br, skipChunk bytes (buf) at
// most every skipPause, until the server may log a line again; it counts
// a line when it begins. inLine says that the line under way was counted
// already. It returns whether the line under way then was (its rest is to
// be skipped), and false at the pipe's end.
func (s *Server) skipOutput(br *bufio.Reader, buf []byte, inLine bool) (cut, more bool) {
	read := func() error {
		n, err := br.Read(buf)
		if n > 0 {
			lines := bytes.Count(buf[:n-1], []byte{'\n'})
			if !inLine {
				lines++
			}
			inLine = buf[n-1] != '\n'
			s.output.drop(time.Now(), uint64(lines))
		}
		return err
	}
	for {
		// What br holds, if anything (that reads nothing from the pipe),
		// then up to skipChunk from the pipe at once.
		if br.Buffered() > 0 {
			if err := read(); err != nil {
				return inLine, false
			}
		}
		if err := read(); err != nil {
			return inLine, false
		}
		time.Sleep(skipPause)
		if s.output.ready(time.Now()) {
			return inLine, true
		}
	}
}

// logOutput logs a line of the output of process pid, if the rate lets
// it, and reports whether it did.
func (s *Server) logOutput(pid int, line string, cut bool) bool {
	ok, dropped, first := s.output.take(time.Now())
	if first {
		s.m.log.Warn("uap output over the rate; dropping lines until it slows", "server", s.spec.Server, "pid", pid,
			"rate", s.output.rate, "burst", s.output.burst)
	}
	if !ok {
		return false
	}
	if dropped > 0 {
		s.m.log.Warn("uap output dropped over the rate", "server", s.spec.Server, "lines", dropped,
			"rate", s.output.rate)
	}
	if cut {
		s.m.log.Info("uap output", "server", s.spec.Server, "pid", pid, "line", line, "cut", true)
		return true
	}
	s.m.log.Info("uap output", "server", s.spec.Server, "pid", pid, "line", line)
	return true
}
