package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"tpsched/scd"
)

// The operator's actions on the control socket: hold and release, prc and
// chprc, restart, profile.

// hold holds or releases a group over the control socket and says what
// happened.
func hold(ctx context.Context, nd node, verb string, args []string, stdout io.Writer) error {
	if len(args) != 1 {
		return usageError(verb + " GROUP")
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodPost, "http://scdd/"+verb+"?group="+url.QueryEscape(args[0]), nd.where(), "")
	if err != nil {
		return err
	}
	var res scd.HoldResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("%s: answer from %s: %w", verb, nd.sock, err)
	}
	switch {
	case res.Held && res.Changed:
		fmt.Fprintf(stdout, "held service group %s: new calls get 'service closed'", res.Group)
		if res.InFlight > 0 {
			fmt.Fprintf(stdout, "; the %d call(s) queued or running still finish", res.InFlight)
		}
		fmt.Fprintln(stdout)
	case res.Held:
		fmt.Fprintf(stdout, "service group %s was already held; nothing changed\n", res.Group)
	case res.Changed:
		fmt.Fprintf(stdout, "released service group %s: it takes calls again\n", res.Group)
	default:
		fmt.Fprintf(stdout, "service group %s was not held; nothing changed\n", res.Group)
	}
	return nil
}

// prc lists the processes of one group or all (OpenTP1's prcls).
func prc(ctx context.Context, nd node, asJSON bool, args []string, stdout io.Writer) error {
	if len(args) > 1 {
		return usageError("prc [GROUP] [-json]")
	}
	u := "http://scdd/prc"
	if len(args) == 1 {
		u += "?group=" + url.QueryEscape(args[0])
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodGet, u, nd.where(), "")
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var groups []scd.GroupProcesses
	if err := json.Unmarshal(body, &groups); err != nil {
		return fmt.Errorf("prc: answer from %s: %w", nd.sock, err)
	}
	printProcesses(stdout, groups, time.Now())
	return nil
}

// printProcesses shows each group's parallel_count and a line per process.
func printProcesses(stdout io.Writer, groups []scd.GroupProcesses, now time.Time) {
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "GROUP\tSLOT\tPID\tKIND\tSTATE\tCALLS\tSERVED\tCPU-S\tRESTARTS\tREPLACED\tSINCE")
	for _, g := range groups {
		for _, p := range g.Processes {
			pid, since := "-", "-"
			if p.PID != 0 {
				pid = strconv.Itoa(p.PID)
			}
			if !p.Started.IsZero() {
				since = p.Started.Local().Format("2006-01-02 15:04:05") + " (" + now.Sub(p.Started).Round(time.Second).String() + ")"
			}
			state := string(p.State)
			if p.LaneFor != 0 {
				state += fmt.Sprintf(" (lane for pid %d)", p.LaneFor)
			}
			fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%d\t%d\t%.3f\t%d\t%d\t%s\n", g.Group, p.Slot, pid, p.Kind, state,
				p.Calls, p.Served, p.CPUSeconds, p.Restarts, p.Replaced, since)
		}
	}
	tw.Flush()
	for _, g := range groups {
		def := ""
		if g.Count != g.Def {
			def = " (defined " + g.Def.String() + ", changed by chprc)"
		}
		fmt.Fprintf(stdout, "%s: server %s, parallel_count %s%s\n", g.Group, g.Server, g.Count, def)
	}
	fmt.Fprintln(stdout, "CALLS: calls a process holds now (its current one and those handed over ahead, up to 8); SERVED: calls it completed.")
}

// chprc changes a group's process counts while it runs (OpenTP1's scdchprc).
func chprc(ctx context.Context, nd node, asJSON bool, args []string, stdout io.Writer) error {
	const use = "chprc GROUP RESIDENT[,MAX] [-json]"
	if len(args) != 2 {
		return usageError(use)
	}
	resident, maxProcs, hasMax := args[1], "", false
	if r, m, ok := strings.Cut(args[1], ","); ok {
		resident, maxProcs, hasMax = strings.TrimSpace(r), strings.TrimSpace(m), true
	}
	if _, err := strconv.Atoi(resident); err != nil {
		return usageError(use + ": RESIDENT is a whole number")
	}
	q := url.Values{"group": {args[0]}, "resident": {resident}}
	if hasMax {
		if _, err := strconv.Atoi(maxProcs); err != nil {
			return usageError(use + ": MAX is a whole number")
		}
		q.Set("max", maxProcs)
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodPost, "http://scdd/chprc?"+q.Encode(), nd.where(), "")
	if err != nil {
		return err
	}
	if asJSON {
		_, err := stdout.Write(body)
		return err
	}
	var res scd.ChprcResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("chprc: answer from %s: %w", nd.sock, err)
	}
	if res.Before == res.Count {
		fmt.Fprintf(stdout, "service group %s: parallel_count was %s already; nothing changed\n", res.Group, res.Count)
	} else {
		fmt.Fprintf(stdout, "service group %s: parallel_count %s -> %s (defined %s; until the node stops or restarts)", res.Group, res.Before, res.Count, res.Def)
		if res.Count.Resident > res.Before.Resident {
			fmt.Fprintf(stdout, "; %d more resident process(es) start", res.Count.Resident-res.Before.Resident)
		}
		if res.Count.Resident < res.Before.Resident {
			fmt.Fprintf(stdout, "; %d resident process(es) stop after their current call", res.Before.Resident-res.Count.Resident)
		}
		if res.Count.Max < res.Before.Max {
			fmt.Fprint(stdout, "; non-resident processes above the maximum stop after their current call")
		}
		fmt.Fprintln(stdout)
	}
	printProcesses(stdout, []scd.GroupProcesses{res.GroupProcesses}, time.Now())
	return nil
}

// restart asks the node to hand its sockets to a new scdd.
func restart(ctx context.Context, nd node, args []string, stdout io.Writer) error {
	if len(args) != 0 {
		return usageError("restart")
	}
	body, err := httpDo(ctx, controlClient(nd), http.MethodPost, "http://scdd/restart", nd.where(), "")
	if errors.Is(err, context.DeadlineExceeded) {
		// The node takes the request's end for its caller giving up, and
		// undoes a hand-over not yet done: -t (30 s by default) is shorter
		// than the new process's 60 s to start its groups.
		return fmt.Errorf("%w; the node undoes a restart its caller stops waiting for: the process it had serves on, unless the hand-over was done by then (give -t more time, e.g. -t 2m)", err)
	}
	if err != nil {
		return err
	}
	var res scd.RestartResult
	if err := json.Unmarshal(body, &res); err != nil {
		return fmt.Errorf("restart: answer from %s: %w", nd.sock, err)
	}
	fmt.Fprintf(stdout, "restarted: pid %d serves the node (it took %s); pid %d lets its %d connection(s) go and drains\n",
		res.NewPID, res.Took, res.OldPID, res.Conns)
	// The operator who started scdd from a shell holds the old pid ($!,
	// %1) and would signal a process that is gone (issue 31 item 6).
	fmt.Fprintf(stdout, "stop the node with kill %d from now on (a shell's $! or %%1 names pid %d, which exits once drained)\n",
		res.NewPID, res.OldPID)
	// A restart reads the definitions afresh: what the operator changed
	// in the old process is gone, and a held group takes calls again.
	if len(res.Held) > 0 {
		fmt.Fprintf(stdout, "held in pid %d, taking calls again in pid %d (a restart reads the definitions): %s; scdctl hold GROUP holds one again\n",
			res.OldPID, res.NewPID, strings.Join(res.Held, ", "))
	}
	if len(res.Changed) > 0 {
		fmt.Fprintf(stdout, "parallel_count changed by chprc in pid %d, as defined again in pid %d: %s; scdctl chprc GROUP RESIDENT[,MAX] changes one again\n",
			res.OldPID, res.NewPID, strings.Join(res.Changed, ", "))
	}
	return nil
}

// profiles are the profiles scdd serves (net/http/pprof's and Go's
// runtime/pprof's); another name got only scdd's "Unknown profile".
var profiles = []string{"heap", "goroutine", "allocs", "block", "mutex", "threadcreate", "profile", "trace"}

// maxProfileSeconds bounds a CPU profile or trace: an hour.
const maxProfileSeconds = 3600

// profile writes one of scdd's Go profiles to stdout.
func profile(nd node, timeout time.Duration, args []string, stdout io.Writer) error {
	if len(args) < 1 || len(args) > 2 || !slices.Contains(profiles, args[0]) {
		return usageError("pprof PROFILE [SECONDS]: PROFILE is " + strings.Join(profiles, ", "))
	}
	u := "http://scdd/debug/pprof/" + args[0]
	if timed := args[0] == "profile" || args[0] == "trace"; timed {
		secs := 30
		if args[0] == "trace" {
			secs = 1
		}
		if len(args) == 2 {
			// Past the bound the seconds would overflow a time.Duration,
			// here and in scdd, which then stops the profile at once.
			n, err := strconv.Atoi(args[1])
			if err != nil || n < 1 || n > maxProfileSeconds {
				return usageError(fmt.Sprintf("pprof %s [SECONDS]: SECONDS is a whole number, 1..%d", args[0], maxProfileSeconds))
			}
			secs = n
		}
		u += "?seconds=" + strconv.Itoa(secs)
		// The profile takes its seconds: wait for them and a little more.
		timeout = max(timeout, time.Duration(secs)*time.Second+10*time.Second)
	} else if len(args) == 2 {
		return usageError("pprof " + args[0] + ": SECONDS only for profile and trace")
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	body, err := httpDo(ctx, controlClient(nd), http.MethodGet, u, nd.where(), "")
	if err != nil {
		return err
	}
	_, err = stdout.Write(body)
	return err
}

// where names the node's control socket in an error.
func (nd node) where() string { return "control socket " + nd.sock }

// controlClient speaks HTTP over the node's control socket.
func controlClient(nd node) *http.Client {
	return &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			if nd.sockErr != nil {
				return nil, nd.sockErr
			}
			var d net.Dialer
			c, err := d.DialContext(ctx, "unix", nd.sock)
			if err == nil {
				return c, nil
			}
			switch {
			case errors.Is(err, syscall.ENOENT):
				where := ""
				if len(nd.socks) > 1 {
					where = " nor at " + strings.Join(nd.socks[1:], ", ")
				}
				return nil, fmt.Errorf("no control socket at %s%s (is scdd running? -s names the socket, -c DIR reads node_id and control_socket from its sysconf)", nd.sock, where)
			case errors.Is(err, syscall.EACCES), errors.Is(err, syscall.EPERM):
				return nil, fmt.Errorf("control socket %s: %w (it admits only scdd's own user and root)", nd.sock, err)
			case errors.Is(err, syscall.ECONNREFUSED):
				return nil, fmt.Errorf("control socket %s: nobody listens (scdd stopped?)", nd.sock)
			}
			return nil, fmt.Errorf("control socket %s: %w", nd.sock, err)
		},
	}}
}

// httpDo runs one request to where (the control socket's path, or the
// node's HTTP address); hint is added to an error in reaching the node.
func httpDo(ctx context.Context, hc *http.Client, method, u, where, hint string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, err
	}
	// A node that takes the request and never answers leaves only the
	// context's 'deadline exceeded', which names no node.
	late := func(err error) error {
		if errors.Is(err, context.DeadlineExceeded) {
			return fmt.Errorf("no answer from %s before -t ran out (%w)", where, err)
		}
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // the method and URL say nothing the message does not
		}
		err = late(err)
		if hint != "" {
			err = fmt.Errorf("%w (%s)", err, hint)
		}
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, late(err)
	}
	if resp.StatusCode >= 300 {
		if msg := strings.TrimSpace(string(bytes.TrimSpace(body))); msg != "" {
			return nil, errors.New(msg)
		}
		return nil, fmt.Errorf("%s answered %s, with no reason", where, resp.Status)
	}
	return body, nil
}
