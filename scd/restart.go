package scd

// Restart without dropping a call. The running scdd (the old process)
// starts a new one with the same command line and a unix socket of its own
// (SOCK_SEQPACKET, fd 3, TPSCHED_TAKEOVER_FD=3), and they hand over:
//
//	new: starts its groups (its own shared memory and UAPs)  -> "ready"
//	old: duplicates its listening sockets (RPC port and every receiver
//	     group, metrics_address, the control socket) and stops accepting;
//	     connections that arrive meanwhile wait in the backlogs. With them
//	     go the application environments whose servers it runs, and it
//	     starts no more  -> "listeners" + the descriptors (SCM_RIGHTS;
//	     past 253 in messages "more")
//	new: serves on them (its steering program replaces the old one),
//	     starts those environments' servers  -> "serving"
//	old: stops its cluster membership without leaving (the others keep
//	     sending to the node's address), freeing the name port  -> "left"
//	new: joins the cluster under the same node id and address
//	old: tells every connection's caller to go away (KindGoAway): no new
//	     call on it, the answers of the calls sent still come; serves until
//	     the callers have closed them (at most DrainTimeout), then drains as
//	     on SIGTERM: queued calls finish, its UAPs stop; exits 0.
//	     A stop it gets meanwhile is the node's: it goes on to the new
//	     process  -> "stop"
//
// The listening sockets are never closed on the way, so no connection is
// refused or reset; a caller that obeys the go-away (tpsched's client, the
// forwarder, scdctl) loses no call. If the new process fails before
// "serving" (bad definitions, a crash, 60 s without an answer), the old one
// takes its sockets back and goes on serving, and the restart reports why;
// what its join could fail on after "serving" it makes sure of before
// (ports.claimNames).

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/netio/rpcport"
	"tpsched/scd/names"
	"tpsched/scd/wlmnode"
)

// TakeoverEnv names the descriptor of the hand-over socket a new scdd
// inherits from the old one.
const TakeoverEnv = "TPSCHED_TAKEOVER_FD"

// How long each side waits for the other during a hand-over.
const (
	takeoverReadyTime   = 60 * time.Second // the new process to start its groups
	takeoverServingTime = 30 * time.Second // the new process to serve on the sockets
	takeoverLeftTime    = 10 * time.Second // the old process to leave the cluster
	// The new process starts the old one's environment servers within
	// this, well inside takeoverServingTime (a start that fails at its
	// deadline takes up to procmgr's stop time more): one that has not
	// started by then is left to the cluster.
	takeoverEnvsTime = 15 * time.Second
)

// RestartResult answers a restart on the control socket.
type RestartResult struct {
	OldPID int    `json:"old_pid"`
	NewPID int    `json:"new_pid"`
	Took   string `json:"took"`  // from the request to the new process serving
	Conns  int    `json:"conns"` // connections the old process tells to go away
	// Held and Changed are what the new process, which reads the
	// definitions afresh, does not keep: the groups the old one held
	// (they take calls again) and those whose parallel_count chprc had
	// changed (they run as defined again).
	Held    []string `json:"held,omitempty"`
	Changed []string `json:"chprc_changed,omitempty"`
}

// restarter is a node's part in a hand-over, as the old or the new
// process.
type restarter struct {
	n          *Node
	running    atomic.Bool  // a Restart is under way
	handedOver atomic.Bool  // this (old) process gave its sockets away
	newPID     atomic.Int64 // the process it gave them to
	// handedTo is the hand-over socket to that process, kept open after
	// the commit: a stop is passed on over it (drainedByRestart).
	handedTo *net.UnixConn
	// stopping: a Drain was asked (SIGTERM): no restart starts, and one
	// under way is undone unless it committed already.
	stopping   atomic.Bool
	cancelMu   sync.Mutex
	cancel     context.CancelFunc // ends the waits of the restart under way
	settled    chan struct{}      // closed once the restart under way is done or undone; nil before any
	retiredOne sync.Once
	retired    chan struct{} // made by retiredCh
	retireErr  error         // set before retired closes

	// The new process's side: the socket to the old one and what came
	// over it; after the commit, watched for a stop the old one passes on
	// (stopAsked, closed once by stopOnce), until shutdown closes it
	// (oldConn).
	peer           *net.UnixConn
	oldConn        atomic.Pointer[net.UnixConn]
	stopMade       sync.Once
	stopOnce       sync.Once
	stopAsked      chan struct{} // made by stopAskedCh
	oldGone        chan struct{} // made at the commit, closed when watchOld ends
	oldPID         int           // the old process: this one's parent while it runs
	inheritRPC     []rpcport.Listener
	inheritMetrics net.Listener
	inheritControl *net.UnixListener
	inheritNames   *names.Transport
	inheritEnvs    *wlmnode.Handover // the old process's application environments
	// takenControl is the control socket's listener once taken (whoever
	// holds it then): its path is unlinked at its close only from the
	// hand-over's commit on, since until then the path is the old
	// process's to keep if the hand-over is undone.
	takenControl *net.UnixListener
}

// closeInherited closes what came from the old process and nothing took
// (a start that failed).
func (rs *restarter) closeInherited() {
	for _, l := range rs.inheritRPC {
		if l.File != nil {
			_ = l.File.Close()
		}
	}
	rs.inheritRPC = nil
	if rs.inheritMetrics != nil {
		_ = rs.inheritMetrics.Close()
		rs.inheritMetrics = nil
	}
	if rs.inheritControl != nil {
		rs.inheritControl.SetUnlinkOnClose(false) // the path is the old process's again
		_ = rs.inheritControl.Close()
		rs.inheritControl = nil
	}
	if rs.inheritNames != nil {
		rs.inheritNames.Close()
		rs.inheritNames = nil
	}
}

// takeoverMsg is one message of the hand-over.
type takeoverMsg struct {
	Step    string             `json:"step"` // ready, listeners, serving, left, failed; stop (after left)
	PID     int                `json:"pid,omitempty"`
	Error   string             `json:"error,omitempty"`
	RPC     []rpcport.Listener `json:"rpc,omitempty"`     // the descriptors follow in this order...
	Metrics bool               `json:"metrics,omitempty"` // ...then metrics_address's...
	Control string             `json:"control,omitempty"` // ...then the control socket's (its path)...
	// Names: in "ready", the new process takes the name port's sockets;
	// in "listeners", they follow (TCP, then UDP).
	Names bool `json:"names,omitempty"`
	// Files is how many descriptors come with the message: more than one
	// message carries (scmMaxFD) follow it in messages "more".
	Files int `json:"files,omitempty"`
	// Envs, in "listeners": the application environments whose server
	// serves in the old process, which the new one starts before
	// "serving", and their states.
	Envs *wlmnode.Handover `json:"envs,omitempty"`
}

// scmMaxFD is the most descriptors one message carries (the kernel's
// SCM_MAX_FD): a node with 256 receiving sockets hands over 260, and one
// message of them failed with 'invalid argument'.
const scmMaxFD = 253

// maxMsgBytes is the longest message either side reads.
const maxMsgBytes = 64 << 10

// sendMsg sends m with files, in as many messages as they need.
func sendMsg(c *net.UnixConn, m takeoverMsg, files []*os.File) error {
	m.Files = len(files)
	for first := true; first || len(files) > 0; first = false {
		part := files[:min(len(files), scmMaxFD)]
		files = files[len(part):]
		if !first {
			m = takeoverMsg{Step: "more"}
		}
		if err := sendOne(c, m, part); err != nil {
			return err
		}
	}
	return nil
}

func sendOne(c *net.UnixConn, m takeoverMsg, files []*os.File) error {
	b, err := json.Marshal(m)
	if err != nil {
		return err
	}
	var oob []byte
	if len(files) > 0 {
		fds := make([]int, len(files))
		for i, f := range files {
			fds[i] = int(f.Fd())
		}
		oob = unix.UnixRights(fds...)
	}
	_, _, err = c.WriteMsgUnix(b, oob, nil)
	return err
}

// recvMsg reads a message and the descriptors that came with it (and
// with the messages "more" after it).
func recvMsg(c *net.UnixConn, deadline time.Time) (takeoverMsg, []*os.File, error) {
	m, files, err := recvOne(c, deadline)
	for err == nil && len(files) < m.Files {
		var more takeoverMsg
		var part []*os.File
		more, part, err = recvOne(c, deadline)
		files = append(files, part...)
		if err == nil && (more.Step != "more" || len(part) == 0) {
			err = fmt.Errorf("hand-over: got %q with %d descriptors after %d of %d", more.Step, len(part), len(files)-len(part), m.Files)
		}
	}
	if err != nil {
		closeFiles(files)
		return m, nil, err
	}
	return m, files, nil
}

// recvOne reads one message and the descriptors that came with it. On
// any error the descriptors that came are closed: a message whose control
// part was cut (MSG_CTRUNC: the kernel dropped the descriptors past the
// buffer, or those this process had no room for, at its RLIMIT_NOFILE)
// is refused at once, not taken for fewer descriptors (recvMsg would then
// wait for the rest until its deadline, watchOld for ever).
func recvOne(c *net.UnixConn, deadline time.Time) (takeoverMsg, []*os.File, error) {
	var m takeoverMsg
	_ = c.SetReadDeadline(deadline)
	buf, oob := make([]byte, maxMsgBytes), make([]byte, unix.CmsgSpace(4*scmMaxFD))
	n, oobn, flags, _, err := c.ReadMsgUnix(buf, oob)
	if err != nil {
		return m, nil, err
	}
	var files []*os.File
	if oobn > 0 {
		msgs, perr := unix.ParseSocketControlMessage(oob[:oobn])
		if perr != nil {
			err = fmt.Errorf("hand-over: %w", perr)
		}
		for i := range msgs {
			if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
				continue // credentials, say: no descriptors
			}
			fds, perr := unix.ParseUnixRights(&msgs[i])
			if perr != nil {
				err = fmt.Errorf("hand-over: %w", perr)
				continue
			}
			for _, fd := range fds {
				unix.CloseOnExec(fd)
				files = append(files, os.NewFile(uintptr(fd), "inherited socket"))
			}
		}
	}
	switch {
	case err != nil:
	case flags&unix.MSG_CTRUNC != 0:
		err = fmt.Errorf("hand-over: a message's descriptors were cut short (%d came; is the open files limit reached?)", len(files))
	case flags&unix.MSG_TRUNC != 0:
		err = fmt.Errorf("hand-over: a message longer than %d bytes", len(buf))
	case n == 0:
		err = errors.New("the other process closed the hand-over socket")
	default:
		if uerr := json.Unmarshal(buf[:n], &m); uerr != nil {
			err = fmt.Errorf("hand-over: %w", uerr)
		}
	}
	if err != nil {
		closeFiles(files)
		return m, nil, err
	}
	return m, files, nil
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		_ = f.Close()
	}
}

// Restart starts a new scdd that takes this node's sockets over, and
// returns once it serves; this node then lets its callers go, drains and
// ends (Retired). On any failure before the new process serves, this node
// keeps its sockets and serves on, and the error says why.
func (n *Node) Restart(ctx context.Context) (RestartResult, error) { return n.restart.restart(ctx) }

func (r *restarter) restart(ctx context.Context) (RestartResult, error) {
	n, rs := r.n, r
	if !rs.running.CompareAndSwap(false, true) {
		// Said here too: a SIGUSR2 has nobody else to tell.
		err := errors.New("restart: one is under way already")
		if rs.handedOver.Load() {
			err = fmt.Errorf("restart: this process handed the node to pid %d already and drains: restart that one", rs.newPID.Load())
		}
		n.log.Warn("restart refused", "err", err)
		return RestartResult{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	settled := make(chan struct{})
	r.cancelMu.Lock()
	r.cancel, r.settled = cancel, settled
	r.cancelMu.Unlock()
	res, err := r.restart1(ctx)
	r.cancelMu.Lock()
	r.cancel = nil
	r.cancelMu.Unlock()
	close(settled) // after restart1's writes (handedTo), which a stop reads then
	if err != nil {
		rs.running.Store(false)
		n.log.Error("restart failed; this process serves on", "err", err)
		return res, err
	}
	return res, nil
}

func (r *restarter) restart1(ctx context.Context) (RestartResult, error) {
	n := r.n
	start := time.Now()
	res := RestartResult{OldPID: os.Getpid()}
	if n.draining.Load() || r.handedOver.Load() || r.stopping.Load() {
		return res, errors.New("restart: the node is draining")
	}
	if !n.started.Load() {
		// Its control socket serves before Start has joined the cluster
		// (or, in a new process, before the old one left it): a hand-over
		// from there would give a node half started.
		return res, errors.New("restart: the node has not finished starting")
	}
	exe := n.opts.RestartProgram
	if exe == "" {
		var err error
		if exe, err = os.Executable(); err != nil {
			return res, fmt.Errorf("restart: %w", err)
		}
	}
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("restart: %w", os.NewSyscallError("socketpair", err))
	}
	ours, theirs := os.NewFile(uintptr(fds[0]), "hand-over"), os.NewFile(uintptr(fds[1]), "hand-over")
	fc, err := net.FileConn(ours)
	ours.Close()
	if err != nil {
		theirs.Close()
		return res, fmt.Errorf("restart: %w", err)
	}
	conn := fc.(*net.UnixConn)
	committed := false
	defer func() {
		if !committed {
			conn.Close()
		}
	}()
	cmd := exec.Command(exe, n.opts.RestartArgs...)
	cmd.Env = append(os.Environ(), TakeoverEnv+"=3")
	cmd.ExtraFiles = []*os.File{theirs}
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if n.opts.Restarting != nil {
		n.opts.Restarting()
	}
	err = cmd.Start()
	theirs.Close()
	if err != nil {
		return res, fmt.Errorf("restart: start %s: %w", exe, err)
	}
	res.NewPID = cmd.Process.Pid
	exit := &exitWatch{done: make(chan struct{})}
	go func() { exit.err = cmd.Wait(); close(exit.done) }()
	fail := func(err error) (RestartResult, error) {
		// Whatever the new process got, it gets no further: it exits when
		// the socket closes (or is killed, if it does not).
		conn.Close()
		select {
		case <-exit.done:
		case <-time.After(5 * time.Second):
			_ = cmd.Process.Kill()
		}
		return res, err
	}
	n.log.Info("restart: new process started; waiting for it to start its groups", "pid", res.NewPID)

	m, _, err := r.waitStep(ctx, conn, exit, "ready", takeoverReadyTime)
	if err != nil {
		return fail(err)
	}

	// Hand the sockets over; take them back if anything goes wrong.
	rpc, err := n.rpc.HandOff()
	if err != nil {
		return fail(fmt.Errorf("restart: %w", err))
	}
	files := make([]*os.File, 0, len(rpc)+2)
	for _, l := range rpc {
		files = append(files, l.File)
	}
	msg := takeoverMsg{Step: "listeners", RPC: rpc}
	metricsF, controlF, err := n.doors.handOff()
	if err != nil {
		_ = n.rpc.Resume(rpc)
		return fail(fmt.Errorf("restart: %w", err))
	}
	if metricsF != nil {
		files, msg.Metrics = append(files, metricsF), true
	}
	if controlF != nil {
		files, msg.Control = append(files, controlF), ControlSocketPath(n.cfg)
	}
	var namesF []*os.File // duplicates: this process's memberlist keeps its own
	if np := n.router.NamePort(); m.Names && np != nil {
		// The name port goes over too, held open throughout: the new
		// process's UAPs run already, and one could bind the port between
		// this process leaving it and the new one joining.
		if tcpF, udpF, err := np.Files(); err == nil {
			files, msg.Names = append(files, tcpF, udpF), true
			namesF = []*os.File{tcpF, udpF}
		} else {
			n.log.Warn("restart: the name port is not handed over; the new process binds it after this one leaves", "err", err)
		}
	}
	if n.wlm != nil {
		msg.Files = len(files) // as sendMsg sets it: fitEnvs measures the message whole
		msg.Envs = r.fitEnvs(msg, n.wlm.HandOver())
	}
	undo := func(err error) (RestartResult, error) {
		// The new process ends first: its steering program, if attached,
		// lets the sockets go only once it is replaced and freed.
		res, err = fail(err)
		if rerr := n.rpc.Resume(rpc); rerr != nil {
			err = errors.Join(err, rerr)
		}
		n.doors.resume(metricsF, controlF)
		closeFiles(namesF)
		if n.wlm != nil {
			n.wlm.TakeBack()
		}
		return res, err
	}
	if err := sendMsg(conn, msg, files); err != nil {
		return undo(fmt.Errorf("restart: send the sockets: %w", err))
	}
	if m, _, err = r.waitStep(ctx, conn, exit, "serving", takeoverServingTime); err != nil {
		return undo(err)
	}
	if r.stopping.Load() {
		// A stop came during the hand-over: it is for the node, so the
		// new process, which commits only on "left", is let go and this
		// one drains. Past this point the stop finds the hand-over done
		// and passes itself on (drainedByRestart).
		return undo(errors.New("restart: the node is stopping"))
	}
	// The new process serves: the sockets are its own now.
	closeFiles(files)
	r.newPID.Store(int64(res.NewPID))
	r.handedTo, committed = conn, true // left open for the process's life: a stop goes over it
	r.handedOver.Store(true)
	res.Took = time.Since(start).Round(time.Millisecond).String()
	// Stop without leaving: the other nodes keep sending to this node's
	// address, where the new process now accepts, and take the new
	// process's announces (a newer boot) when it has joined on the name
	// port this frees.
	stopped := time.Now()
	n.router.StopWithoutLeaving()
	if took := time.Since(stopped); took > time.Second {
		// Until the new process joins, which waits for "left", no
		// process of this node answers on the name port, and the other
		// nodes may take it for dead.
		n.log.Warn("restart: stopping the cluster membership was slow", "took", took.Round(time.Millisecond))
	}
	if err := sendMsg(conn, takeoverMsg{Step: "left"}, nil); err != nil {
		n.log.Warn("restart: telling the new process the cluster was left", "err", err)
	}
	n.doors.letGo() // before the line that says so: the RPC callers' go-away follows in retire
	res.Conns = n.rpc.Stats().Conns
	n.log.Info("restart: the new process serves; letting callers go and draining", "new_pid", m.PID, "took", res.Took,
		"connections", res.Conns)
	if res.Held, res.Changed = n.local.NotKeptByRestart(); len(res.Held)+len(res.Changed) > 0 {
		n.log.Warn("restart: the new process read the definitions: groups held here take calls again, "+
			"parallel_count changed by chprc is as defined again (scdctl hold, chprc to have them back)",
			"held", strings.Join(res.Held, ","), "chprc_changed", strings.Join(res.Changed, ","))
	}
	go r.retire()
	return res, nil
}

// fitEnvs is h as it fits in msg, a message the new process reads into
// maxMsgBytes: every state, else the quiesced ones (the new process
// learns the others from the cluster; a node alone, from nobody), else
// none; said in the log when it does not all fit.
func (r *restarter) fitEnvs(msg takeoverMsg, h wlmnode.Handover) *wlmnode.Handover {
	for i, try := range []wlmnode.Handover{h, h.QuiescedOnly(), {Serving: h.Serving}} {
		msg.Envs = &try
		if b, err := json.Marshal(msg); err == nil && len(b) <= maxMsgBytes {
			if i > 0 {
				r.n.log.Warn("restart: the application environments' states do not all fit in the hand-over; the new process learns them from the cluster",
					"states", len(h.States), "passed", len(try.States))
			}
			return &try
		}
	}
	r.n.log.Warn("restart: the application environments serving here do not fit in the hand-over; the new process starts them dormant",
		"serving", len(h.Serving))
	return nil
}

// exitWatch is the new process's end: done closes when it exited, with
// err its status.
type exitWatch struct {
	done chan struct{}
	err  error
}

// waitStep waits for the new process's message step; an exit, a failure
// message, ctx or the time limit end the wait with an error.
func (r *restarter) waitStep(ctx context.Context, conn *net.UnixConn, exit *exitWatch, step string, limit time.Duration) (takeoverMsg, []*os.File, error) {
	type got struct {
		m     takeoverMsg
		files []*os.File
		err   error
	}
	ch := make(chan got, 1)
	go func() {
		m, files, err := recvMsg(conn, time.Now().Add(limit))
		ch <- got{m, files, err}
	}()
	select {
	case g := <-ch:
		closeFiles(g.files) // the new process sends none
		switch {
		case g.err != nil:
			select {
			case <-exit.done:
				return g.m, nil, fmt.Errorf("restart: the new process exited (%v) before %q", exit.err, step)
			case <-time.After(100 * time.Millisecond):
			}
			return g.m, nil, fmt.Errorf("restart: waiting for %q from the new process: %w", step, g.err)
		case g.m.Step == "failed":
			return g.m, nil, fmt.Errorf("restart: the new process failed: %s", g.m.Error)
		case g.m.Step != step:
			return g.m, nil, fmt.Errorf("restart: the new process said %q, want %q", g.m.Step, step)
		}
		return g.m, nil, nil
	case <-exit.done:
		// It may have said why first.
		select {
		case g := <-ch:
			closeFiles(g.files)
			if g.m.Step == "failed" {
				return g.m, nil, fmt.Errorf("restart: the new process failed: %s", g.m.Error)
			}
		case <-time.After(100 * time.Millisecond):
		}
		return takeoverMsg{}, nil, fmt.Errorf("restart: the new process exited (%v) before %q", exit.err, step)
	case <-ctx.Done():
		return takeoverMsg{}, nil, fmt.Errorf("restart: %w", ctx.Err())
	}
}

// retire lets the callers of the old process go and drains it.
func (r *restarter) retire() {
	n := r.n
	rs := r
	told := n.rpc.GoAway("this node hands its port to a new process: send new calls on a new connection")
	start := time.Now()
	t := time.NewTicker(20 * time.Millisecond)
	defer t.Stop()
	for n.rpc.Stats().Conns > 0 && time.Since(start) < n.opts.DrainTimeout {
		<-t.C
	}
	left := n.rpc.Stats().Conns
	n.log.Info("restart: callers gone; draining", "told", told, "still_open", left, "took", time.Since(start).Round(time.Millisecond))
	rs.retireErr = n.drain(context.Background())
	if rs.retireErr != nil {
		// Said here: scdd ends on Retired, and only a stop passed on
		// after it (Drain) gets the error too.
		n.log.Error("restart: the old process's drain", "err", rs.retireErr)
	}
	close(rs.retiredCh())
}

func (r *restarter) retiredCh() chan struct{} {
	rs := r
	rs.retiredOne.Do(func() { rs.retired = make(chan struct{}) })
	return rs.retired
}

// Retired is closed when this process has handed its sockets to a new
// one (Restart) and finished draining.
func (n *Node) Retired() <-chan struct{} { return n.restart.retiredCh() }

// drainedByRestart is Drain's way around a restart: it waits for one under
// way to settle, and when this process handed its sockets over, waits for
// its own drain instead of starting another.
//
// A stop is for the node, whichever of its processes gets it: a restart
// under way is undone (its waits end now), none starts from here on, and
// when the hand-over was done already the new process is asked to stop
// too, as under systemd before the new process named itself the main one.
// It is asked over the hand-over socket ("stop"), not by a signal: a stop
// sent to both processes (Ctrl-C at a terminal, a kill of the process
// group, pkill) reaches the new one twice then, and a second signal is the
// operator's way to exit at once, without draining. SIGTERM only when the
// message cannot go (a new process of an older version closed its end).
func (r *restarter) drainedByRestart() (bool, error) {
	rs := r
	rs.stopping.Store(true)
	rs.cancelMu.Lock()
	if rs.cancel != nil {
		rs.cancel()
	}
	settled := rs.settled
	rs.cancelMu.Unlock()
	if settled != nil {
		<-settled // the restart under way is undone (or had committed)
	}
	handed, to := rs.handedOver.Load(), rs.handedTo
	if !handed {
		return false, nil
	}
	if pid := int(rs.newPID.Load()); pid > 0 {
		r.n.log.Info("stop: passing it on to the process the node was handed to", "pid", pid)
		if to == nil || sendMsg(to, takeoverMsg{Step: "stop"}, nil) != nil {
			if err := unix.Kill(pid, unix.SIGTERM); err != nil && !errors.Is(err, unix.ESRCH) {
				r.n.log.Warn("stop: the new process could not be told", "pid", pid, "err", err)
			}
		}
	}
	<-rs.retiredCh()
	return true, rs.retireErr
}

// The new process's side.

// TakeoverConn is the hand-over socket a new scdd inherited, from
// TakeoverEnv; nil when there is none.
func TakeoverConn() (*net.UnixConn, error) {
	v := os.Getenv(TakeoverEnv)
	if v == "" {
		return nil, nil
	}
	os.Unsetenv(TakeoverEnv) // not for the UAPs, nor a later restart
	fd, err := strconv.Atoi(v)
	if err != nil || fd < 3 {
		return nil, fmt.Errorf("%s=%q: want a descriptor number", TakeoverEnv, v)
	}
	f := os.NewFile(uintptr(fd), "hand-over")
	c, err := net.FileConn(f)
	f.Close()
	if err != nil {
		return nil, fmt.Errorf("%s: %w", TakeoverEnv, err)
	}
	uc, ok := c.(*net.UnixConn)
	if !ok {
		c.Close()
		return nil, fmt.Errorf("%s: not a unix socket", TakeoverEnv)
	}
	return uc, nil
}

// takeOver asks the old process for its sockets, once this one's groups
// have started.
func (r *restarter) takeOver() error {
	n := r.n
	rs := r
	if rs.peer == nil {
		return nil
	}
	if err := sendMsg(rs.peer, takeoverMsg{Step: "ready", PID: os.Getpid(), Names: true}, nil); err != nil {
		return fmt.Errorf("take over: %w", err)
	}
	m, files, err := recvMsg(rs.peer, time.Now().Add(takeoverReadyTime))
	if err != nil {
		return fmt.Errorf("take over: waiting for the sockets: %w", err)
	}
	want := len(m.RPC)
	if m.Metrics {
		want++
	}
	if m.Control != "" {
		want++
	}
	if m.Names {
		want += 2
	}
	if m.Step != "listeners" || len(files) != want {
		closeFiles(files)
		return fmt.Errorf("take over: got %q with %d descriptors, want the listeners and %d", m.Step, len(files), want)
	}
	for i := range m.RPC {
		m.RPC[i].File = files[i]
	}
	rs.inheritRPC = m.RPC
	files = files[len(m.RPC):]
	if m.Metrics {
		ln, err := net.FileListener(files[0])
		files[0].Close()
		files = files[1:]
		if err != nil {
			closeFiles(files)
			return fmt.Errorf("take over: metrics listener: %w", err)
		}
		rs.inheritMetrics = ln
	}
	if m.Control != "" {
		ln, err := net.FileListener(files[0])
		files[0].Close()
		files = files[1:]
		if err != nil {
			closeFiles(files)
			return fmt.Errorf("take over: control socket: %w", err)
		}
		ul, ok := ln.(*net.UnixListener)
		if !ok || m.Control != ControlSocketPath(n.cfg) {
			ln.Close()
			closeFiles(files)
			return fmt.Errorf("take over: the control socket %s is not this node's (%s)", m.Control, ControlSocketPath(n.cfg))
		}
		ul.SetUnlinkOnClose(false) // until the commit (takeoverServing)
		rs.inheritControl, rs.takenControl = ul, ul
	}
	if m.Names {
		t, err := names.TransportFromFiles(files[0], files[1])
		if err != nil {
			return fmt.Errorf("take over: %w", err)
		}
		rs.inheritNames = t
	}
	rs.inheritEnvs = m.Envs
	var envs []string
	if m.Envs != nil {
		envs = m.Envs.Serving
	}
	n.log.Info("take over: got the listening sockets of the old process", "rpc", len(m.RPC), "metrics", m.Metrics,
		"control", m.Control != "", "name_port", m.Names, "environments_serving", strings.Join(envs, ","))
	return nil
}

// whileOldWaits is a context that ends when the old process closes the
// hand-over socket (or sends anything) before this one said "serving": it
// undid the hand-over (a stop came, its caller gave up) and will kill
// this process if it does not exit. Nothing comes from the old process in
// that step otherwise. done ends the watch, and leaves the socket's
// messages unread for takeoverServing.
func (r *restarter) whileOldWaits() (ctx context.Context, done func()) {
	ctx, cancel := context.WithCancel(context.Background())
	peer := r.peer
	if peer == nil {
		return ctx, cancel
	}
	raw, err := peer.SyscallConn()
	if err != nil {
		return ctx, cancel
	}
	watched := make(chan struct{})
	go func() {
		defer close(watched)
		// The netpoller waits for the socket to be readable between the
		// calls. Each call peeks, reading nothing: a close (or a message)
		// that came before the watch began is seen at the first, since
		// the netpoller forgets readiness it noticed before (edge
		// triggered).
		rerr := raw.Read(func(fd uintptr) bool {
			var b [1]byte
			_, _, err := unix.Recvfrom(int(fd), b[:], unix.MSG_PEEK|unix.MSG_DONTWAIT)
			return err != unix.EAGAIN && err != unix.EINTR
		})
		if rerr == nil {
			cancel()
		}
	}()
	return ctx, func() {
		_ = peer.SetReadDeadline(time.Now()) // ends the wait
		<-watched
		_ = peer.SetReadDeadline(time.Time{})
		cancel()
	}
}

// takeoverServing tells the old process this one serves, and waits until
// it has left the cluster (so that this one may join on the name port).
//
// The old process's "left" is the hand-over's commit: it gave its sockets
// away for good before it sends it, and sends it before it closes the
// hand-over socket. A socket closed without it, while the old process
// still runs, is a hand-over undone (its wait for "serving" ran out, or
// its caller gave up, before it read this one's): the old process has
// taken its sockets back and serves, so this one must not (and was to be
// killed for it); it leaves without unlinking the control socket's path,
// which is the old process's. An old process that died, or one that says
// nothing within takeoverLeftTime, leaves the sockets to this one.
func (r *restarter) takeoverServing() error {
	n := r.n
	rs := r
	if rs.peer == nil {
		return nil
	}
	peer := rs.peer
	rs.peer = nil
	oldRuns := func() bool { return rs.oldPID != 0 && os.Getppid() == rs.oldPID }
	var m takeoverMsg
	err := sendMsg(peer, takeoverMsg{Step: "serving", PID: os.Getpid()}, nil)
	if err == nil {
		m, _, err = recvMsg(peer, time.Now().Add(takeoverLeftTime))
	}
	if err == nil && m.Step == "left" {
		// Committed: the old process may pass a stop on over the socket
		// (drainedByRestart) while it drains.
		rs.oldConn.Store(peer)
		rs.oldGone = make(chan struct{})
		go rs.watchOld(peer)
	} else {
		peer.Close()
	}
	switch {
	case err == nil && m.Step == "left":
	case !errors.Is(err, os.ErrDeadlineExceeded) && oldRuns():
		return fmt.Errorf("take over: the old process (pid %d) took its sockets back (step %q, %v)", rs.oldPID, m.Step, err)
	default:
		n.log.Warn("take over: the old process did not say it left the cluster; joining all the same", "err", err, "step", m.Step)
	}
	if rs.takenControl != nil {
		rs.takenControl.SetUnlinkOnClose(true) // the path is this process's now
	}
	return nil
}

// watchOld waits for a stop the old process passes on (it got one after
// the commit), until the old process ends or closeOld closes the socket.
func (r *restarter) watchOld(c *net.UnixConn) {
	if gone := r.oldGone; gone != nil { // made with the commit (tests call this alone)
		defer close(gone)
	}
	for {
		// One message at a time: the old process sends no descriptors
		// now, and a message that said some follow (Files) would have
		// recvMsg wait for them, with no deadline, and the stop unheard.
		m, files, err := recvOne(c, time.Time{})
		closeFiles(files)
		if err != nil {
			return
		}
		if m.Step == "stop" {
			r.stopOnce.Do(func() { close(r.stopAskedCh()) })
		}
	}
}

func (r *restarter) stopAskedCh() chan struct{} {
	r.stopMade.Do(func() { r.stopAsked = make(chan struct{}) })
	return r.stopAsked
}

// waitOld waits, until by at the most, for the old process of the
// restart that started this one to end (its socket's end: it exited), so
// that this one's exit does not leave it draining: a supervisor that stops
// the node by its main process (systemd's MAINPID, this one since the
// commit) kills what remains of the unit once that process ends, and the
// old process's calls in flight would be cut off unanswered. Nothing to
// wait for without a committed hand-over or with a zero by.
func (r *restarter) waitOld(by time.Time) {
	if r.oldGone == nil || by.IsZero() {
		return
	}
	select {
	case <-r.oldGone:
		return
	default:
	}
	r.n.log.Info("stop: waiting for the old process to end its drain", "pid", r.oldPID)
	t := time.NewTimer(time.Until(by))
	defer t.Stop()
	select {
	case <-r.oldGone:
	case <-t.C:
		r.n.log.Warn("stop: the old process still drains; stopping without it", "pid", r.oldPID)
	}
}

// closeOld closes the socket to the old process (the node stops), which
// ends watchOld.
func (r *restarter) closeOld() {
	if c := r.oldConn.Swap(nil); c != nil {
		c.Close()
	}
}

// StopAsked is closed when the old process of the restart that started
// this one passes a stop on (it got SIGTERM after the hand-over): the
// node stops as on a signal, but this is no signal of the operator's, and
// a second one must not exit at once (scdd).
func (n *Node) StopAsked() <-chan struct{} { return n.restart.stopAskedCh() }

// RefuseTakeover tells the old process that this one cannot take over
// (its definitions did not load, say), so the restart reports why; conn
// is TakeoverConn's and may be nil.
func RefuseTakeover(conn *net.UnixConn, err error) {
	if conn != nil {
		_ = sendMsg(conn, takeoverMsg{Step: "failed", Error: err.Error()}, nil)
		conn.Close()
	}
}

// takeoverFailed tells the old process this one cannot take over.
func (r *restarter) takeoverFailed(err error) {
	if rs := r; rs.peer != nil {
		_ = sendMsg(rs.peer, takeoverMsg{Step: "failed", Error: err.Error()}, nil)
		rs.peer.Close()
		rs.peer = nil
	}
}
