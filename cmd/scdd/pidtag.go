package main

import (
	"context"
	"log/slog"
	"sync/atomic"
)

// pidTag adds scdd's process id to each log line once on is set: from the
// moment a restart starts the new process, the old and the new one write
// to one stderr, and a line must say which of them wrote it. A plain
// node's lines go without it.
type pidTag struct {
	slog.Handler
	on  *atomic.Bool
	pid int
}

func (h *pidTag) Handle(ctx context.Context, r slog.Record) error {
	if h.on.Load() {
		r = r.Clone()
		r.AddAttrs(slog.Int("scdd_pid", h.pid))
	}
	return h.Handler.Handle(ctx, r)
}

func (h *pidTag) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &pidTag{Handler: h.Handler.WithAttrs(attrs), on: h.on, pid: h.pid}
}

func (h *pidTag) WithGroup(name string) slog.Handler {
	return &pidTag{Handler: h.Handler.WithGroup(name), on: h.on, pid: h.pid}
}
