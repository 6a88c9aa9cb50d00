package scd

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"tpsched/bpf"
	"tpsched/procmgr"
	"tpsched/scd/def"
)

// CheckEntries is scdd -check -entries: it starts one process of every
// server that receives from its queue, waits until it registered its
// entries (or died, or timeout passed), stops it, and returns an error,
// naming the definition's file and line, for each service whose entry the
// module does not register and each module that did not start. It runs
// the modules, as start-up would, so it is asked for: plain -check starts
// nothing. A socket-receiving server does not say its entries; it is
// skipped.
func (n *Node) CheckEntries(timeout time.Duration) []error {
	// What the check finds it returns; the node's own log would say it
	// again at warning level.
	n.log = slog.New(minLevel{slog.LevelError, n.log.Handler()})
	for _, g := range n.order {
		g.log = n.log
	}
	n.meter = bpf.Open(bpf.Options{Force: bpf.Proc, Logger: n.log}) // a check measures nothing
	if n.pm == nil {
		n.pm = procmgrManager{procmgr.New(procmgr.Options{Logger: n.log, Meter: n.meter, SchedBatch: n.cfg.System.UAPSchedBatch})}
	}
	defer n.shutdown()
	var errs []error
	for _, g := range n.order {
		if g.def.ReceiveFrom == def.ReceiveSocket {
			continue
		}
		g.def.Resident, g.def.MaxProcesses = 1, 1
		if err := n.startGroup(g); err != nil {
			errs = append(errs, err)
			continue
		}
		entries, err := g.firstEntries(timeout)
		if err != nil {
			errs = append(errs, g.def.Errorf("module", "%s: %v", g.def.Module, err))
			continue
		}
		for _, svc := range g.def.Services {
			if !slices.Contains(entries, svc.Entry) {
				errs = append(errs, g.def.Errorf("service", "entry %q of service %s is not registered by module %s (it registers %v)",
					svc.Entry, svc.Name, g.def.Module, entries))
			}
		}
	}
	return errs
}

// firstEntries waits for the group's first process to attach and returns
// the entries it registered.
func (g *group) firstEntries(timeout time.Duration) ([]string, error) {
	end := time.Now().Add(timeout)
	for time.Now().Before(end) {
		if err := g.failing.Load(); err != nil {
			return nil, *err
		}
		g.mu.Lock()
		si := &g.slots[0]
		var entries []string
		if si.p != nil && si.attached {
			entries = si.p.Entries()
		}
		g.mu.Unlock()
		if entries != nil {
			return entries, nil
		}
		time.Sleep(10 * time.Millisecond)
	}
	return nil, fmt.Errorf("no process attached within %v", timeout)
}

// minLevel is a slog.Handler that drops records below its level.
type minLevel struct {
	min slog.Level
	slog.Handler
}

func (h minLevel) Enabled(ctx context.Context, l slog.Level) bool {
	return l >= h.min && h.Handler.Enabled(ctx, l)
}

func (h minLevel) WithAttrs(attrs []slog.Attr) slog.Handler {
	return minLevel{h.min, h.Handler.WithAttrs(attrs)}
}

func (h minLevel) WithGroup(name string) slog.Handler {
	return minLevel{h.min, h.Handler.WithGroup(name)}
}
