package local

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

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
//
// pm starts the processes; the scheduler is stopped when the check ends.
func (s *Scheduler) CheckEntries(pm ProcessManager, timeout time.Duration) []error {
	// What the check finds it returns; the node's own log would say it
	// again at warning level.
	s.log = ErrorsOnly(s.log)
	for _, g := range s.order {
		g.log = s.log
	}
	s.pm = pm
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), UAPStopTime)
		_ = s.Stop(ctx)
		cancel()
		_ = s.Close()
	}()
	if err := s.startDispatcher(); err != nil {
		return []error{err}
	}
	var errs []error
	for _, g := range s.order {
		if g.def.ReceiveFrom == def.ReceiveSocket {
			continue
		}
		g.def.Resident, g.def.MaxProcesses = 1, 1
		if err := s.startGroup(g); err != nil {
			errs = append(errs, err)
			continue
		}
		entries, err := firstEntries(g, timeout)
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
func firstEntries(g *Group, timeout time.Duration) ([]string, error) {
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

// checkEntries warns once per process when it does not offer an entry its
// definition names (a typo in `service = "name=entry"`, an old module).
// Under mu: the warning is written once mu is let go (logLater).
func checkEntries(g *Group, slot int, si *slotState) {
	got := si.p.Entries()
	if got == nil || si.warned {
		return // socket mode does not say
	}
	have := make(map[string]bool, len(got))
	for _, e := range got {
		have[e] = true
	}
	for _, svc := range g.def.Services {
		if !have[svc.Entry] {
			si.warned = true
			g.logLater(slog.LevelWarn, g.def.Errorf("service", "entry %q of service %s is not registered by module %s (it registers %v)",
				svc.Entry, svc.Name, g.def.Module, got).Error(), "slot", slot, "pid", si.p.PID())
		}
	}
}

// ErrorsOnly is l without its records below error level.
func ErrorsOnly(l *slog.Logger) *slog.Logger { return slog.New(minLevel{slog.LevelError, l.Handler()}) }

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
