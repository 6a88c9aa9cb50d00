package def

import (
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"syscall"
	"testing"
	"time"
)

var clientEnv = []string{"DCHOST", "DCSCDDIRECT", "DCHOSTSELECT", "DCSCDHOSTCHANGE", "DCCLTLOADBALANCE",
	"DCCACHE", "DCCLTCACHETIM", "DCNAMUSE", "DCWATCHTIM", "DCMAXMSGSIZE"}

// clearClientEnv hides the caller's own client variables (empty = unset).
func clearClientEnv(t *testing.T) {
	for _, v := range clientEnv {
		t.Setenv(v, "")
	}
}

func writeFile(t *testing.T, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "betranrc")
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestLoadClientDefaults(t *testing.T) {
	clearClientEnv(t)
	c, err := LoadClient("")
	if err != nil {
		t.Fatal(err)
	}
	want := Client{CacheEntries: 64, CacheTime: 30 * time.Second, WatchTime: 180 * time.Second, MaxMessageSize: 1 << 20}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("got %+v, want %+v", *c, want)
	}
}

func TestLoadClientFileAndEnv(t *testing.T) {
	clearClientEnv(t)
	path := writeFile(t, `# client environment
set dchost = host1:12000, host2, \
             "[::1]:13000"
set dcscddirect = Y
set dchostselect = y
set dcscdhostchange = N
set dccltloadbalance = Y
set dccache = 10
set dccltcachetim = 5
set dcnamuse = Y
set watch_time = 9
set max_message_size = 2048
`)
	c, err := LoadClient(path)
	if err != nil {
		t.Fatal(err)
	}
	want := Client{
		Hosts: []string{"host1:12000", "host2", "[::1]:13000"}, HostSelect: true, HostChange: false,
		SchedulerDirect: true, LoadBalance: true, CacheEntries: 10, CacheTime: 5 * time.Second,
		WatchTime: 9 * time.Second, MaxMessageSize: 2048,
	}
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("file:\ngot  %+v\nwant %+v", *c, want)
	}

	t.Setenv("DCHOST", "a:1, b")
	t.Setenv("DCSCDHOSTCHANGE", "Y")
	t.Setenv("DCSCDDIRECT", "n")
	t.Setenv("DCCACHE", "3")
	t.Setenv("DCWATCHTIM", "0")
	c, err = LoadClient(path)
	if err != nil {
		t.Fatal(err)
	}
	want.Hosts, want.HostChange, want.CacheEntries, want.WatchTime = []string{"a:1", "b"}, true, 3, 0
	want.SchedulerDirect = false // DCSCDDIRECT=n
	if !reflect.DeepEqual(*c, want) {
		t.Fatalf("env over file:\ngot  %+v\nwant %+v", *c, want)
	}
}

func TestLoadClientErrors(t *testing.T) {
	for _, tc := range []struct {
		name string
		file string
		env  map[string]string
		err  string // the whole error; "FILE" stands for the path
	}{
		{"bad host", "set dchost = \"a b\"\n", nil, `FILE:1: dchost: bad host "a b"`},
		{"bad port", "\nset dchost = a:70000\n", nil, `FILE:2: dchost: port in "a:70000": 70000 out of range 1..65535`},
		{"too many hosts", "set dchost = " + nodes(129) + "\n", nil, `FILE:1: dchost: 129 hosts, at most 128`},
		{"bad bool", "set dcnamuse = 1\n", nil, `FILE:1: dcnamuse: want Y or N, got "1"`},
		{"cache 0", "set dccache = 0\n", nil, `FILE:1: dccache: 0 out of range 1..4096`},
		{"cache time", "set dccltcachetim = 65536\n", nil, `FILE:1: dccltcachetim: 65536 out of range 0..65535`},
		{"message size", "set dcmaxmsgsize = 9000000\n", nil, `FILE:1: dcmaxmsgsize: 9000000 out of range 1024..8388608`},
		{"alias and name", "set dcwatchtim = 1\nset watch_time = 2\n", nil, `FILE:2: watch_time: already set as dcwatchtim at line 1`},
		{"unknown", "set dcfoo = 1\n", nil, `FILE:1: dcfoo: unknown operand`},
		{"misspelt", "set dchots = a\n", nil, `FILE:1: dchots: unknown operand (did you mean dchost?)`},
		{"misspelt alias", "set watch_tim = 1\n", nil, `FILE:1: watch_tim: unknown operand (did you mean watch_time?)`},
		{"server operand", "set queue_size = 1\n", nil, `FILE:1: queue_size: unknown operand here (it belongs in usrrc or usr/<server>)`},
		{"putenv", "putenv A b\n", nil, `FILE:1: putenv: only allowed in usrrc and usr files`},
		{"env host", "", map[string]string{"DCHOST": "a,,b"}, `environment: DCHOST: empty address`},
		{"env bool", "", map[string]string{"DCCLTLOADBALANCE": "yes"}, `environment: DCCLTLOADBALANCE: want Y or N, got "yes"`},
		{"env number", "", map[string]string{"DCCACHE": "x"}, `environment: DCCACHE: want an unsigned integer, got "x"`},
		{"env two values", "", map[string]string{"DCWATCHTIM": "1,2"}, `environment: DCWATCHTIM: want one value, got 2`},
		{"multi_schedule", "set multi_schedule = Y\n", nil, `FILE:1: multi_schedule: unknown operand here (it belongs in usrrc or usr/<server>)`},
		{"command", "scdmulti -g a -p 1\n", nil, `FILE:1: scdmulti: unknown command (this file takes set statements only)`},
		// A putenv or a command named as an operand is no setting of it:
		// the set after it was said to be set twice, at the putenv's line.
		{"putenv of an operand's name", "putenv dchost a\nset dchost = b\n", nil, `FILE:1: putenv: only allowed in usrrc and usr files`},
		{"command of an operand's name", "dcwatchtim -t 1\nset watch_time = 2\n", nil, `FILE:1: dcwatchtim: unknown command (this file takes set statements only)`},
		{"namuse Y alone", "set dcnamuse = Y\n", nil, `FILE:1: dcnamuse: Y is not supported with dccltloadbalance = N (its default): tpsched's client asks the name service only to balance; set dccltloadbalance = Y or remove dcnamuse`},
		{"namuse N, balance Y", "set dcnamuse = N\nset dccltloadbalance = Y\n", nil, `FILE:1: dcnamuse: N contradicts dccltloadbalance = Y (FILE:2), which asks the name service (client-side balancing needs dcnamuse = Y); set Y or remove dcnamuse`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clearClientEnv(t)
			for k, v := range tc.env {
				t.Setenv(k, v)
			}
			path := writeFile(t, tc.file)
			_, err := LoadClient(path)
			want := strings.ReplaceAll(tc.err, "FILE", path)
			if err == nil || err.Error() != want {
				t.Fatalf("error = %v\nwant    %s", err, want)
			}
		})
	}
	clearClientEnv(t)
	// What the client does anyway is accepted.
	for _, ok := range []string{"set dcscddirect = Y\n", "set dcscddirect = Y\nset dccltloadbalance = Y\n",
		"set dcscddirect = N\nset dccltloadbalance = Y\n", "set dcscddirect = N\n", "set dccltloadbalance = N\nset dcscddirect = n\n",
		"set dcnamuse = Y\nset dccltloadbalance = Y\n", "set dcnamuse = N\n"} {
		if _, err := LoadClient(writeFile(t, ok)); err != nil {
			t.Errorf("%q: %v", ok, err)
		}
	}
	if _, err := LoadClient(filepath.Join(t.TempDir(), "none")); err == nil {
		t.Error("missing file: no error")
	}
}

// TestLoadClientPastTheBound: betranrc is bounded as a definition file is.
func TestLoadClientPastTheBound(t *testing.T) {
	clearClientEnv(t)
	path := writeFile(t, "")
	if err := os.Truncate(path, maxDefinitionSize+1); err != nil {
		t.Fatal(err)
	}
	_, err := LoadClient(path)
	want := "client definition: " + path + ": 16777217 bytes, more than a definition file may have (16777216, 16 MiB)"
	if err == nil || err.Error() != want {
		t.Fatalf("error = %.300v\nwant    %s", err, want)
	}
}

// TestLoadClientRefusesWhatIsNoFile: a named pipe as betranrc held
// LoadClient for ever (the open waits for a writer), as it held Load
// (2a117ca); it is refused at once, and so is a device.
func TestLoadClientRefusesWhatIsNoFile(t *testing.T) {
	clearClientEnv(t)
	for _, c := range []struct {
		name string
		make func(p string) error
		err  string
	}{
		{"fifo", func(p string) error { return syscall.Mkfifo(p, 0o600) }, ": not a regular file (a named pipe)"},
		{"device", func(p string) error { return os.Symlink("/dev/zero", p) }, ": not a regular file (a device)"},
	} {
		t.Run(c.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "betranrc")
			if err := c.make(p); err != nil {
				t.Fatal(err)
			}
			err := notWaitingOn(t, p, func() error { _, err := LoadClient(p); return err })
			want := "client definition: " + p + c.err
			if err == nil || err.Error() != want {
				t.Fatalf("error = %v\nwant    %s", err, want)
			}
		})
	}
}
