package bench

import (
	"io"
	"slices"
	"strings"
	"testing"
)

// On loopback the nodes keep their addresses and programs run as they
// are; the setup line says loopback. The lab itself is netlab's test
// (internal/netlab: TestOpen), as root.
func TestNodeNetLoopback(t *testing.T) {
	ips := []string{"127.0.0.2", "127.0.0.3", "127.0.0.4"}
	for _, name := range []string{"", NetLoopback} {
		nn, err := openNet(Config{Net: name, Log: io.Discard}, ips)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(nn.ips, ips) || nn.short() != NetLoopback || !strings.HasPrefix(nn.describe(), "Network: loopback") {
			t.Errorf("-net %q: ips %v, %q, %q", name, nn.ips, nn.short(), nn.describe())
		}
		if prog, args := nn.command(0, "scdd", "-c", "d"); prog != "scdd" || !slices.Equal(args, []string{"-c", "d"}) {
			t.Errorf("-net %q: command %s %v", name, prog, args)
		}
		if err := nn.close(); err != nil {
			t.Error(err)
		}
	}
	if _, err := openNet(Config{Net: "wan", Log: io.Discard}, ips); err == nil {
		t.Error("-net wan was taken")
	}
	if got := ipRange(s7RealIPs(8)); got != "127.0.0.10 to 127.0.0.17, 8 addresses" {
		t.Errorf("ipRange: %q", got)
	}
}
