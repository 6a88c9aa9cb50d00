package scd

import (
	"log/slog"
	"net"
	"path/filepath"
	"strings"
	"testing"

	"github.com/VictoriaMetrics/metrics"

	"tpsched/scd/def"
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
