// Package local is the node's local scheduler: its service groups, each
// with its schedule queue (scd/schedq), the transport to its UAP processes
// (shared memory, package shm, or a socket, shm/sockmode) and the user
// server whose processes serve it (started by a ProcessManager: procmgr in
// scdd); the calls those processes make of their own; load levels; the
// operator's prc and chprc; the check of the entries a module registers.
// It owns no port and knows no other node: a call reaches it as the last
// stage of the node's line (package call), and the calls its processes
// make go back to the node's line (Options.Place).
//
// # Contracts
//
//   - Scheduler.Route and Serve run on gnet event loops and on reply
//     readers: they never block. A call they accept (netio.CodeOK) is
//     answered exactly once through its call.Caller (a completion,
//     'timed out' at its deadline, 'server terminated' when the process
//     serving it dies, 'node shutting down' at Stop), or not at all when
//     it asked for none.
//   - A group is procmgr's Delegate for its processes (delegate.go); the
//     group never calls its ProcessManager with its own lock held, since
//     procmgr calls back into it.
//   - One dispatcher (reader.go) is the one goroutine that waits on the
//     shared-memory groups' processes (their doorbells); a socket-receiving
//     group has a reader of its own. They answer callers and place the
//     processes' own calls without the group's lock.
//   - Options.Place and Options.LevelChanged are called without any lock
//     of the scheduler held.
//   - A process that dies holding calls: the completions it wrote are
//     answered, the call it had taken is answered 'server terminated',
//     the calls it never took go back to the head of the queue.
//
// # Usage
//
//	s, err := local.New(cfg, local.Options{Logger: log, Metrics: set, CounterFunc: counter,
//		Place: uapLine.Route, LevelChanged: announce})
//	err = s.Start(local.Procmgr(procmgr.New(...))) // queues, processes, readers
//	code, msg := s.Serve(conn, &frame)             // a call for one of its groups
//	...
//	err = s.Stop(ctx)  // refuse, let the processes finish, answer what is left
//	err = s.Close()    // end the readers, unmap the shared memory
package local
