package scd

import (
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/scd/def"
	"tpsched/scd/names"
)

// TestTakeoverMetricsAddressAsDefined: the new process of a restart reads
// the definitions afresh, and a metrics_address they changed is served
// there or the restart fails saying why. One it could not bind (an
// address of no interface here, a port another process holds) was taken
// for the old process's, left to the hand-over, and the new process served
// /metrics on the old address and said nothing.
func TestTakeoverMetricsAddressAsDefined(t *testing.T) {
	discard := slog.New(slog.DiscardHandler)
	config := func(maddr string) *def.Config {
		dir := shortTemp(t)
		return &def.Config{Dir: dir, System: def.System{NodeID: "n1", RPCAddress: "127.0.0.1", MetricsAddress: maddr,
			ControlSocket: filepath.Join(dir, "ctl.sock")}}
	}
	old, err := net.Listen("tcp", "127.0.0.1:0") // the old process's, handed over
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	other, err := net.Listen("tcp", "127.0.0.1:0") // another program's
	if err != nil {
		t.Fatal(err)
	}
	defer other.Close()

	t.Run("an address of no interface here", func(t *testing.T) {
		cfg := config("192.0.2.1:9100")
		p, err := bindPorts(cfg, rpcOptions(cfg, Options{}, metrics.NewSet(), discard), true)
		p.close()
		if err == nil || !strings.Contains(err.Error(), "metrics_address 192.0.2.1:9100") {
			t.Errorf("bindPorts taking over: %v, want the metrics_address's error", err)
		}
	})
	for _, tc := range []struct {
		name, maddr string
		taken       bool
	}{
		{"the old process's address", old.Addr().String(), true},
		{"a port the kernel picks", "127.0.0.1:0", true},
		{"a port another program holds", other.Addr().String(), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := config(tc.maddr)
			p, err := bindPorts(cfg, rpcOptions(cfg, Options{}, metrics.NewSet(), discard), true)
			if err != nil {
				t.Fatal(err)
			}
			defer p.close()
			inh, err := old.(*net.TCPListener).File()
			if err != nil {
				t.Fatal(err)
			}
			ln, err := net.FileListener(inh)
			inh.Close()
			if err != nil {
				t.Fatal(err)
			}
			rs := &restarter{n: &Node{cfg: cfg}, inheritMetrics: ln}
			p.takeInherited(rs)
			if taken := p.http == ln; taken != tc.taken {
				t.Errorf("metrics_address %s: the old process's listener (%s) taken: %v, want %v", tc.maddr, old.Addr(), taken, tc.taken)
			}
		})
	}
}

// TestClaimNamesBeforeTheCommit: a new process that takes a node in a
// cluster over makes sure of its name port before it says it serves. A
// port another program holds fails it (naming the port); a port the old
// process holds and did not hand over is left to the join, which binds it
// once the old process left (as before the name port went over); a port
// nothing holds is bound; a node alone needs none.
func TestClaimNamesBeforeTheCommit(t *testing.T) {
	held, err := names.ListenTransport("127.0.0.1", 0) // this process's: the "old process" or "another program"
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	config := func(port int, allNode ...string) *def.Config {
		return &def.Config{System: def.System{NodeID: "n1", RPCAddress: "127.0.0.1", RPCPort: 12001, NamePort: port, AllNodes: allNode}}
	}
	inCluster := config(held.Port(), "127.0.0.1", "127.0.0.9")
	self := os.Getpid()

	var p ports
	if err := p.claimNames(inCluster, self+1); err == nil || !strings.Contains(err.Error(), fmt.Sprintf("name port: port %d", held.Port())) {
		t.Errorf("a port another program holds: %v, want the name port's error", err)
	}
	if err := p.claimNames(inCluster, 0); err == nil {
		t.Error("a fresh start on a port another program holds: no error")
	}
	if err := p.claimNames(inCluster, self); err != nil || p.names != nil {
		t.Errorf("a port the old process holds: %v, bound %v; want it left to the join", err, p.names != nil)
	}
	if err := p.claimNames(config(0, "127.0.0.1", "127.0.0.9"), self); err != nil || p.names == nil {
		t.Errorf("a port the kernel picks: %v, bound %v; want it bound", err, p.names != nil)
	}
	p.close()
	if err := p.claimNames(config(held.Port(), "127.0.0.1"), self+1); err != nil || p.names != nil {
		t.Errorf("a node alone: %v, bound %v; want nothing", err, p.names != nil)
	}
}
