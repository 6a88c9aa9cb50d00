package rpcport

import (
	"bufio"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"tpsched/netio"
)

// inodeHandler records the socket's inode when a call arrives and checks,
// in OnClose, that the descriptor is still that socket.
type inodeHandler struct {
	mu     sync.Mutex
	inode  map[*Conn]uint64
	errs   []string
	closes int
}

func fdInode(fd int) (uint64, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return 0, err
	}
	return st.Ino, nil
}

func (h *inodeHandler) OnFrame(c *Conn, f netio.Frame) {
	ino, err := fdInode(c.fd)
	h.mu.Lock()
	if err != nil {
		h.errs = append(h.errs, "at the call: "+err.Error())
	}
	h.inode[c] = ino
	h.mu.Unlock()
	if f.Kind == netio.KindCall {
		c.SendNow(netio.AppendReply(nil, f.ID, f.Payload))
	}
}

func (h *inodeHandler) OnClose(c *Conn) {
	ino, err := fdInode(c.fd)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.closes++
	switch want, ok := h.inode[c]; {
	case !ok:
	case err != nil:
		h.errs = append(h.errs, "in OnClose the descriptor is closed already: "+err.Error())
	case ino != want:
		h.errs = append(h.errs, "in OnClose the descriptor is another file")
	}
}

// TestGnetClosesAfterOnClose pins what conn.go's writes rely on: gnet calls
// OnClose before it closes the connection's descriptor (true in gnet
// v2.9.7, though its documentation does not promise it), so a write under
// Conn.mu that sees closed unset never hits a closed or reused descriptor.
// An upgrade of gnet that changes the order fails here.
func TestGnetClosesAfterOnClose(t *testing.T) {
	h := &inodeHandler{inode: map[*Conn]uint64{}}
	s := startServer(t, Options{Loops: 2, MaxPayload: 1024}, h)
	const n = 20
	for i := range n {
		c := dial(t, s.Addr())
		if _, err := c.Write(callFrame(1, []byte("x"))); err != nil {
			t.Fatal(err)
		}
		if _, err := readFrame(bufio.NewReader(c)); err != nil {
			// Also what a changed order shows: the descriptor closed
			// early is reused by this connection, then closed again.
			t.Fatalf("connection %d: no reply: %v", i, err)
		}
		if i%2 == 0 {
			_ = c.Close() // the caller's close
		} else {
			_, _ = c.Write([]byte("not a frame header at all")) // the node's close, for a bad frame
			_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
			_, _ = c.Read(make([]byte, 64))
			_ = c.Close()
		}
	}
	waitFor(t, "every connection's OnClose", func() bool {
		h.mu.Lock()
		defer h.mu.Unlock()
		return h.closes == n
	})
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, e := range h.errs {
		t.Error(e)
	}
}
