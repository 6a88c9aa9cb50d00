package bench

import (
	"bufio"
	"net"
	"strings"
	"testing"
	"time"

	"tpsched/netio"
)

func TestReadResponse(t *testing.T) {
	for _, tc := range []struct {
		name, raw string
		status    int
		body      string
		keep      bool
	}{
		{"length", "HTTP/1.1 200 OK\r\nContent-Type: x\r\nContent-Length: 5\r\n\r\nhello", 200, "hello", true},
		{"chunked", "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2;ext=1\r\nlo\r\n0\r\nTrailer: x\r\n\r\n", 200, "hello", true},
		{"close", "HTTP/1.1 200 OK\r\nConnection: close\r\ncontent-length: 2\r\n\r\nhi", 200, "hi", false},
		{"http/1.0", "HTTP/1.0 200 OK\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", false},
		{"1.0 keep-alive", "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi", 200, "hi", true},
		{"502", "HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\n\r\nbad", 502, "bad", true},
		{"to eof", "HTTP/1.1 200 OK\r\n\r\nall of it", 200, "all of it", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := bufio.NewReader(strings.NewReader(tc.raw + "HTTP/1.1 next"))
			if tc.name == "to eof" {
				r = bufio.NewReader(strings.NewReader(tc.raw))
			}
			status, body, keep, err := readResponse(r, nil)
			if err != nil {
				t.Fatal(err)
			}
			if status != tc.status || string(body) != tc.body || keep != tc.keep {
				t.Errorf("got %d %q keep=%v, want %d %q keep=%v", status, body, keep, tc.status, tc.body, tc.keep)
			}
		})
	}
	for _, bad := range []string{"SSH-2.0-x\r\n\r\n", "HTTP/1.1 2x0 OK\r\n\r\n", "HTTP/1.1 200 OK\r\nContent-Length: -1\r\n\r\n", "HTTP/1.1 200 OK\r\nno colon\r\n\r\n"} {
		_, _, _, err := readResponse(bufio.NewReader(strings.NewReader(bad)), nil)
		if _, ok := err.(protocolError); !ok {
			t.Errorf("readResponse(%q): %v, want a protocol error", bad, err)
		}
	}
}

func TestCheckEcho(t *testing.T) {
	if err := checkEcho([]byte("abc"), []byte("abc")); err != nil {
		t.Error(err)
	}
	for _, got := range []string{"ab", "abd", "xbc", ""} {
		if checkEcho([]byte(got), []byte("abc")) == nil {
			t.Errorf("%q accepted as the echo of abc", got)
		}
	}
	if checkEcho(nil, nil) != nil {
		t.Error("empty echo refused")
	}
}

func TestParseMicros(t *testing.T) {
	if parseMicros([]byte(" 200\n")) != 200000 || parseMicros([]byte("x")) != 0 || parseMicros([]byte("-5")) != 0 {
		t.Error("ParseMicros")
	}
}

// A node handing its port to a new process (a restart) tells each caller
// to go away: the tpsched caller sends its next call on a new connection,
// as tpsched's client does, instead of counting it failed.
func TestTpCallerFollowsGoAway(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan int, 4)
	go func() {
		for n := 1; ; n++ {
			nc, err := ln.Accept()
			if err != nil {
				return
			}
			accepted <- n
			go func(nc net.Conn, first bool) {
				defer nc.Close()
				fr := netio.NewFrameReader(nc, 1<<20)
				for {
					f, _, err := fr.Read(nil)
					if err != nil {
						return
					}
					out := netio.AppendReply(nil, f.ID, f.Payload)
					if first {
						// The answer, then go-away: the old process still
						// answers what it read, and takes nothing new.
						out = netio.AppendFrame(out, netio.Header{Kind: netio.KindGoAway}, "", "", []byte("restart"))
					}
					if _, err := nc.Write(out); err != nil {
						return
					}
				}
			}(nc, n == 1)
		}
	}()
	c := tpschedDialer(ln.Addr().String(), "bench", "echo")()
	defer c.Close()
	for i := range 3 {
		o, err := c.Call([]byte("hello"), time.Now().Add(5*time.Second))
		if err != nil || o != callOK {
			t.Fatalf("call %d: outcome %d, %v; want OK", i+1, o, err)
		}
	}
	if n := len(accepted); n != 2 {
		t.Errorf("%d connections, want 2 (the second after the go-away)", n)
	}
}
