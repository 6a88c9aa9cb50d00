// Package shm owns the shared memory between the node daemon (the
// scheduler, scdd) and the UAP (user application program) processes of a
// service group: the group page, one area per process, the doorbells, the
// futex waits with adaptive spinning, and the UAP-side API (Attach, Handle,
// Serve). The schedule queue itself is not here: calls wait in the
// scheduler (scd/schedq), which hands each one to a process.
//
// A UAP links only this package, so shm must not import any other tpsched
// package (shm/internal/sockwire aside). It uses only the standard library
// and golang.org/x/sys/unix. It is Linux-only (5.1 or later).
//
// # Who writes what
//
// A UAP is not trusted. Everything it can write is its own: a call it was
// not handed, another process's area and the scheduler's state are out of
// its reach, so a broken or hostile UAP can spoil only its own calls.
//
//   - The group page (one per group) is written by the scheduler only: the
//     closed flag and whether the reply reader sleeps. The memfd is sealed
//     with F_SEAL_FUTURE_WRITE after the scheduler mapped it, so a UAP can
//     map it read-only only.
//   - A process area (a fresh memfd at every spawn) holds the call handed
//     to that process, its state and its reply. The scheduler keeps its own
//     record of what it handed over and never reads it back: a completion
//     counts only if it answers that call, with a known status and a length
//     that fits.
//   - A doorbell (an eventfd per process) is how a UAP wakes the reader;
//     ringing it without cause only costs its own group a look (and scd
//     kills a process that keeps doing it).
//
// docs/SHM.md is the byte-level specification (layout.go holds the
// offsets, layout_test.go holds the code to them).
//
// # One call
//
//  1. The scheduler copies the request into the process's buffer, writes
//     the entry name, length and deadline, then publishes the dispatch
//     number and bumps the futex word, waking the UAP with FUTEX_WAKE only
//     if it said it sleeps.
//  2. The UAP stores the number as taken, runs the handler on the buffer in
//     place and writes the reply over the request.
//  3. It stores status and length, then the number as done, and rings its
//     doorbell if the group page says the reader sleeps.
//  4. The reader (Group.Wait, then Proc.Completion) checks the answer
//     against the call it handed over, copies the reply out and hands the
//     process its next call.
//
// A process that dies holding a call had taken it (Proc.Taken: it may have
// run part of it, so the caller gets 'server terminated') or had not (the
// call never started and can go to another process).
//
// # Lanes
//
// A UAP's calls in a row to one service may go on a lane (lane.go): one
// process of the called group lent to the caller, the two meeting in a
// memfd of their own, which the scheduler sends each on its control line
// (fd 6) and rules through a claim word when the callee dies, the deadline
// passes or the lane is revoked. UAP.Call uses a lane when the process has
// one, and Serve serves the lane its process is lent to.
//
// # Usage
//
// A UAP program:
//
//	func main() {
//		u, err := shm.Attach() // fds 3 to 6, set up by scdd
//		if err != nil {
//			log.Fatal(err)
//		}
//		u.Handle("echo", func(req []byte) ([]byte, error) {
//			return req, nil // req aliases shm; returning it (or a sub-slice) is fine
//		})
//		if err := u.Serve(); err != nil { // returns nil when asked to leave
//			log.Fatal(err)
//		}
//	}
//
// The scheduler side, under one lock per group (see Group):
//
//	g, _ := shm.NewGroup("demo", 1<<20, 8)
//	p, _ := g.NewProc(0)
//	cmd := exec.Command(module)
//	cmd.ExtraFiles = p.Files()
//	_ = cmd.Start()
//	for !p.Attach() {
//		g.Wait(100 * time.Millisecond)
//	}
//	_ = p.Dispatch("echo", payload, deadline)
//	p.Wake()
//	for { // the reply reader
//		g.Wait(100 * time.Millisecond)
//		if c, ok, err := p.Completion(); ok { ... copy c.Reply ... }
//	}
//
// # Socket mode
//
// A user server with receive_from = socket has exactly one process, which
// gets its calls over a connected unix stream socket (package
// shm/sockmode on the scheduler's side). The UAP code does not change:
// Attach sees TPSCHED_RECEIVE=socket and takes fd TPSCHED_SHM_FD as the
// socket.
//
// # Environment
//
// TPSCHED_SHM_FD (default 3: the area; the group page and the doorbell are
// the next two), TPSCHED_RECEIVE (queue, the default, or socket) and
// TPSCHED_REFRESH (1: serve one call, then leave) are read by Attach.
// TPSCHED_SPIN_US bounds the adaptive spin (microseconds, default 10, 0 =
// never spin, at most 1000) of the UAP's wait for a call and of a calling
// UAP's wait for its answer; on a busy 2-core machine a longer spin takes
// the CPU the woken side needs. TPSCHED_READER_SPIN_US bounds the node's
// reader's spin on the doorbells (default 100, same range), which scdd
// lets run only while no task waits for a CPU (Doorbells.SpinWhile).
package shm
