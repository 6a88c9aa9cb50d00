// Package uapcall is the protocol between the bench harness and its caller
// UAPs (cmd/uap-caller), which make S10's local calls: the run request the
// harness sends to a caller's "run" service, the tally the caller keeps of
// the calls it makes in its loop, and the summary it answers with (counts
// and a latency histogram, which the harness merges over the callers).
//
// It imports nothing of tpsched, so a caller UAP links shm and this package
// only, as any UAP author's program would.
package uapcall

import (
	"bytes"
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"time"
)

// Run is what one caller is asked to do: call Group/Service with a
// Payload-byte request, one call after the other, from when it gets the
// request until End. Calls sent before Start are the warm-up; those sent
// from Start on are measured.
type Run struct {
	Group, Service string
	Payload        int
	Start, End     time.Time
}

// runTag starts every run request, so a request of another kind (or of an
// older harness) is refused rather than misread.
const runTag = "run1"

// Encode is the request's text: "run1 group service payload start end",
// the times as Unix nanoseconds.
func (r Run) Encode() []byte {
	return fmt.Appendf(nil, "%s %s %s %d %d %d", runTag, r.Group, r.Service, r.Payload, r.Start.UnixNano(), r.End.UnixNano())
}

// ParseRun reads a request Encode wrote.
func ParseRun(b []byte) (Run, error) {
	f := strings.Fields(string(b))
	if len(f) != 6 || f[0] != runTag {
		return Run{}, fmt.Errorf("uapcall: a run request is %q group service payload start end, got %.60q", runTag, b)
	}
	var n [3]int64
	for i, s := range f[3:] {
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil || v < 0 {
			return Run{}, fmt.Errorf("uapcall: run request field %d: want a non-negative integer, got %q", i+4, s)
		}
		n[i] = v
	}
	r := Run{Group: f[1], Service: f[2], Payload: int(n[0]), Start: time.Unix(0, n[1]), End: time.Unix(0, n[2])}
	if r.End.Before(r.Start) {
		return Run{}, errors.New("uapcall: run request ends before it starts")
	}
	return r, nil
}

// Payload is the request of n bytes every caller sends: the same bytes as
// the harness's own load generator sends (bench's cellPayload).
func Payload(n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(i*7 + 1)
	}
	return p
}

// Outcome is how one call ended.
type Outcome uint8

const (
	OK       Outcome = iota // answered with the request echoed
	Refused                 // the node answered 'server busy'
	Failed                  // any other error answer
	TimedOut                // the node answered 'timed out'
	Bad                     // a reply that does not echo the request: a fault of the system measured or of the harness
)

// The error codes of the tpsched frame protocol that a shm.CallError
// carries (netio.Code; bench's tests check them against netio's).
const (
	CodeServerBusy = 4
	CodeTimedOut   = 5
)

// OutcomeOf classifies a call's answer: its error code (0 for a reply) and
// its reply against the request.
func OutcomeOf(code uint32, reply, req []byte) Outcome {
	switch code {
	case 0:
		if len(reply) != len(req) || (len(req) > 0 && (reply[0] != req[0] || reply[len(req)-1] != req[len(req)-1])) {
			return Bad
		}
		return OK
	case CodeServerBusy:
		return Refused
	case CodeTimedOut:
		return TimedOut
	}
	return Failed
}

// Tally counts one caller's calls by the rules of the harness's own
// closed loop: a call sent in [Start, End) counts with its outcome (and
// its latency if answered OK); a call answered OK within the window counts
// toward throughput (InWindow) also if it was sent in the warm-up.
type Tally struct {
	Start, End time.Time
	Summary
}

// Count records a call sent at sent and answered at done.
func (t *Tally) Count(sent, done time.Time, o Outcome) {
	inWindow := o == OK && !done.Before(t.Start) && !done.After(t.End)
	if sent.Before(t.Start) {
		if inWindow {
			t.InWindow++
		}
		return
	}
	switch o {
	case OK:
		t.OK++
		t.Hist.Add(done.Sub(sent))
		if inWindow {
			t.InWindow++
		}
	case Refused:
		t.Refused++
	case Failed:
		t.Failed++
	case TimedOut:
		t.TimedOut++
	case Bad:
		t.Bad++
	}
}

// Summary is what a caller answers a run with.
type Summary struct {
	PID                                int
	OK, Refused, Failed, TimedOut, Bad int // calls sent in the window, by outcome
	InWindow                           int // answered OK within the window
	Hist                               Histogram
}

// Sent is the calls sent in the window.
func (s Summary) Sent() int { return s.OK + s.Refused + s.Failed + s.TimedOut + s.Bad }

// Append appends the summary's text to b: "pid=1 ok=2 refused=0 failed=0
// timedout=0 bad=0 inwindow=2 hist=bucket:count,...".
func (s Summary) Append(b []byte) []byte {
	b = fmt.Appendf(b, "pid=%d ok=%d refused=%d failed=%d timedout=%d bad=%d inwindow=%d hist=",
		s.PID, s.OK, s.Refused, s.Failed, s.TimedOut, s.Bad, s.InWindow)
	first := true
	for i, n := range s.Hist.counts {
		if n == 0 {
			continue
		}
		if !first {
			b = append(b, ',')
		}
		first = false
		b = strconv.AppendInt(b, int64(i), 10)
		b = append(b, ':')
		b = strconv.AppendUint(b, n, 10)
	}
	return b
}

// ParseSummary reads a summary Append wrote.
func ParseSummary(b []byte) (Summary, error) {
	var s Summary
	fields := map[string]*int{"pid": &s.PID, "ok": &s.OK, "refused": &s.Refused, "failed": &s.Failed,
		"timedout": &s.TimedOut, "bad": &s.Bad, "inwindow": &s.InWindow}
	seen := map[string]bool{}
	for _, f := range bytes.Fields(b) {
		k, v, ok := bytes.Cut(f, []byte("="))
		if !ok {
			return Summary{}, fmt.Errorf("uapcall: summary field %q is no key=value", f)
		}
		key := string(k)
		if seen[key] {
			return Summary{}, fmt.Errorf("uapcall: summary field %s twice", key)
		}
		seen[key] = true
		if key == "hist" {
			if err := s.Hist.parse(v); err != nil {
				return Summary{}, err
			}
			continue
		}
		dst, known := fields[key]
		if !known {
			return Summary{}, fmt.Errorf("uapcall: unknown summary field %q", key)
		}
		n, err := strconv.Atoi(string(v))
		if err != nil || n < 0 {
			return Summary{}, fmt.Errorf("uapcall: summary field %s: want a count, got %q", key, v)
		}
		*dst = n
	}
	for k := range fields {
		if !seen[k] {
			return Summary{}, fmt.Errorf("uapcall: summary without %s (got %.80q)", k, b)
		}
	}
	if !seen["hist"] {
		return Summary{}, errors.New("uapcall: summary without hist")
	}
	if got := s.Hist.Count(); got != uint64(s.OK) {
		return Summary{}, fmt.Errorf("uapcall: summary's histogram holds %d latencies for %d calls answered OK", got, s.OK)
	}
	return s, nil
}

// Histogram counts latencies in buckets no wider than 1/64 of their lower
// bound (exact below 128 ns), so the percentiles of the merged histograms
// of many callers are within 1.6% of the exact ones.
type Histogram struct {
	counts []uint64
}

// subBits is the buckets per power of two, as a power of two.
const subBits = 6

// bucketOf is the bucket of v nanoseconds: v itself below 2^(subBits+1),
// then 2^subBits buckets for each power of two.
func bucketOf(v uint64) int {
	if v < 1<<(subBits+1) {
		return int(v)
	}
	shift := bits.Len64(v) - (subBits + 1)
	return shift<<subBits + int(v>>shift)
}

// bucketRange is the lowest value of bucket i and its width.
func bucketRange(i int) (low, width uint64) {
	if i < 1<<(subBits+1) {
		return uint64(i), 1
	}
	shift := i>>subBits - 1
	return uint64(i&(1<<subBits-1)|1<<subBits) << shift, 1 << shift
}

// Add counts one latency (a negative one as 0).
func (h *Histogram) Add(d time.Duration) {
	i := bucketOf(uint64(max(d, 0)))
	h.grow(i + 1)
	h.counts[i]++
}

// grow makes room for n buckets.
func (h *Histogram) grow(n int) {
	if n > len(h.counts) {
		h.counts = append(h.counts, make([]uint64, n-len(h.counts))...)
	}
}

// Merge adds o's counts to h.
func (h *Histogram) Merge(o Histogram) {
	h.grow(len(o.counts))
	for i, n := range o.counts {
		h.counts[i] += n
	}
}

// Count is the latencies counted.
func (h Histogram) Count() uint64 {
	var n uint64
	for _, c := range h.counts {
		n += c
	}
	return n
}

// Durations is every latency counted, each as the middle of its bucket,
// in ascending order: the input of the harness's percentiles.
func (h Histogram) Durations() []time.Duration {
	out := make([]time.Duration, 0, h.Count())
	for i, n := range h.counts {
		low, width := bucketRange(i)
		mid := time.Duration(low + width/2)
		for range n {
			out = append(out, mid)
		}
	}
	return out
}

// maxBucket bounds a parsed bucket index: latencies past 2^62 ns do not
// happen, so a larger index is a garbled summary.
const maxBucket = (62 - subBits) << subBits

func (h *Histogram) parse(b []byte) error {
	if len(b) == 0 {
		return nil
	}
	for _, p := range bytes.Split(b, []byte(",")) {
		k, v, ok := bytes.Cut(p, []byte(":"))
		i, err1 := strconv.Atoi(string(k))
		n, err2 := strconv.ParseUint(string(v), 10, 64)
		if !ok || err1 != nil || err2 != nil || i < 0 || i > maxBucket {
			return fmt.Errorf("uapcall: histogram entry %q is no bucket:count", p)
		}
		h.grow(i + 1)
		h.counts[i] += n
	}
	return nil
}
