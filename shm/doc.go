// Package shm owns the shared-memory schedule queue between the node daemon
// (the scheduler, scdd) and the UAP (user application program) processes of one
// service group: the memfd segment, the MPMC schedule queue, the completion
// ring, futex wait/wake with adaptive spinning, the per-process control blocks,
// and the UAP-side API (Attach, Handle, Serve).
//
// A UAP links only this package, so shm must not import any other tpsched
// package (in particular not scd). It uses only the standard library and
// golang.org/x/sys/unix. It is Linux-only.
//
// # Request flow
//
// The scheduler creates one Segment per service group and passes its memfd
// (Segment.File) to every UAP process it spawns as fd 3 (os/exec ExtraFiles),
// with TPSCHED_PROC_SLOT naming the control block the process owns.
//
//  1. Enqueue copies the request into a free request buffer (the scheduler
//     owns buffer allocation), pushes an entry on the schedule queue and wakes
//     a sleeping UAP with FUTEX_WAKE only if one sleeps.
//  2. A UAP takes the entry; its handler reads the request straight from shm
//     and the reply is written in place into the same buffer.
//  3. The UAP pushes {token, status, reply length} on the completion ring.
//  4. The scheduler's reply reader (one goroutine, never a gnet event loop)
//     gets it from WaitCompletions, copies the reply out and calls Release.
//
// # Rules for the scheduler
//
//   - Release a Token only after WaitCompletions returned it or Reclaim
//     returned it. Releasing earlier lets a new request reuse the buffer while
//     a UAP still writes its reply there. A Token that is never released keeps
//     its buffer forever (for a caller that gave up, release when the
//     completion arrives).
//   - Completion.Reply aliases shared memory and is valid until Release.
//   - When a UAP process ends (cleanly or not) call Reclaim(slot) before
//     PrepareSlot(slot) and the next spawn. A process that dies between
//     pushing its completion and marking itself idle is reported by both
//     WaitCompletions and Reclaim: the caller de-duplicates by Token (the
//     first report finishes the request; later ones are dropped, and Reply of
//     a dropped Completion must not be read). Release of a stale Token is a
//     no-op, and WaitCompletions drops completions whose Token was released.
//   - WaitCompletions is called from one goroutine only. Enqueue, Release,
//     Stats and Reclaim are safe for concurrent use.
//   - Close stops Enqueue (ErrClosed), lets UAPs drain what is queued and then
//     makes Serve return nil. Unmap only after every goroutine stopped using
//     the Segment and every Reply was copied out.
//
// # Usage
//
// A UAP program:
//
//	func main() {
//		srv, err := shm.Attach() // fd 3 and TPSCHED_PROC_SLOT, set by scdd
//		if err != nil {
//			log.Fatal(err)
//		}
//		srv.Handle("echo", func(req []byte) ([]byte, error) {
//			return req, nil // req aliases shm; returning it (or a sub-slice) is fine
//		})
//		srv.Handle("upper", func(req []byte) ([]byte, error) {
//			return bytes.ToUpper(req), nil
//		})
//		if err := srv.Serve(); err != nil { // returns nil after Close and drain
//			log.Fatal(err)
//		}
//	}
//
// The scheduler side:
//
//	seg, err := shm.Create("group1", shm.Layout{Slots: 256, MaxMessage: 1 << 20, Processes: 8})
//	_ = seg.PrepareSlot(0)
//	cmd := exec.Command(module)
//	cmd.ExtraFiles = []*os.File{seg.File()}
//	cmd.Env = append(os.Environ(), "TPSCHED_PROC_SLOT=0")
//	_ = cmd.Start()
//
//	go func() { // the reply reader
//		buf := make([]shm.Completion, 0, 256+8)
//		for {
//			for _, c := range seg.WaitCompletions(buf, 100*time.Millisecond) {
//				deliver(c.Token, c.Status, c.Reply) // copies c.Reply
//				seg.Release(c.Token)
//			}
//		}
//	}()
//	tok, err := seg.Enqueue("echo", payload, time.Now().Add(watchTime))
//
// # Socket mode
//
// A user server with receive_from = socket has exactly one process, which
// gets its requests over a connected unix stream socket instead of the memfd.
// The scheduler uses CreateSocket instead of Create: the *SocketQueue it
// returns has the method set of *Segment (slot is always 0), keeps up to
// Slots requests waiting in the node and writes them to the UAP one at a
// time. The UAP code does not change: Attach sees TPSCHED_RECEIVE=socket and
// takes fd TPSCHED_SHM_FD as the socket. Before each spawn call
// PrepareSlot(0) and only then File(): the socketpair of a process that used
// it is replaced by a fresh one. The wire format is described in socket.go.
//
// # Environment
//
// TPSCHED_SHM_FD (default 3), TPSCHED_PROC_SLOT and TPSCHED_RECEIVE (queue, the
// default, or socket) are read by Attach.
// TPSCHED_SPIN_US bounds the adaptive spin (microseconds, default 10, 0 = never
// spin, at most 1000) of both the UAP's take and WaitCompletions. On a machine
// with cores to spare, 50 turns a 9-13 µs round trip into about 1.5 µs (both
// sides stay on CPU); on a busy 2-core machine the small default is kinder.
package shm
