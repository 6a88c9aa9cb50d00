// Package logunderlock is the reader's collect as it was before issue 29
// item 7: log writes under the group's lock, directly and in act; and the
// fix, a record kept under the lock and written after Unlock.
package logunderlock

import (
	"log/slog"
	"sync"
)

type group struct {
	mu   sync.Mutex
	log  *slog.Logger
	logs []string
}

func (g *group) act() {
	g.log.Warn("handing a call failed")
}

func (g *group) collect() {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.log.Error("uap broke the protocol")
	g.act()
	slog.Info("a look")
}

func (g *group) collectLater() {
	g.mu.Lock()
	g.logs = append(g.logs, "uap broke the protocol")
	logs := g.logs
	g.mu.Unlock()
	for _, l := range logs {
		g.log.Error(l)
	}
}
