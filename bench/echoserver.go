package bench

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/panjf2000/gnet/v2"

	"tpsched/netio"
)

// echoServer is the bare peer: a gnet server that answers each call frame
// with its own payload on the event loop. It has no queue, no process
// boundary and no scheduling, so it is the ceiling tpsched is measured
// against.
type echoServer struct {
	gnet.BuiltinEventEngine
	eng   gnet.Engine
	ready chan error
}

// ServeEcho runs an echo server on addr with loops event loops until ctx ends.
func ServeEcho(ctx context.Context, addr string, loops int) error {
	s := &echoServer{ready: make(chan error, 1)}
	errc := make(chan error, 1)
	go func() {
		errc <- gnet.Run(s, "tcp://"+addr,
			gnet.WithNumEventLoop(loops), gnet.WithMulticore(loops > 1), gnet.WithReusePort(true),
			gnet.WithTCPNoDelay(gnet.TCPNoDelay))
	}()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	stopCtx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.eng.Stop(stopCtx); err != nil && !errors.Is(err, context.Canceled) {
		return fmt.Errorf("echo server stop: %w", err)
	}
	return <-errc
}

func (s *echoServer) OnBoot(eng gnet.Engine) gnet.Action {
	s.eng = eng
	return gnet.None
}

func (s *echoServer) OnTraffic(c gnet.Conn) gnet.Action {
	buf, _ := c.Peek(-1)
	var out []byte
	used := 0
	for {
		f, n, err := netio.Decode(buf[used:], 16<<20)
		if errors.Is(err, netio.ErrShort) {
			break
		}
		if err != nil {
			return gnet.Close
		}
		out = netio.AppendReply(out, f.ID, f.Payload)
		used += n
	}
	// Discard(0) would drop everything buffered, a partial frame included.
	if used > 0 {
		_, _ = c.Discard(used)
	}
	if len(out) > 0 {
		_, _ = c.Write(out)
	}
	return gnet.None
}
