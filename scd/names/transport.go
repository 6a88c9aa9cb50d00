package names

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// Transport is memberlist's network on the name port (TCP for streams, UDP
// for packets, one port number), on sockets the node binds itself before it
// starts any UAP (ListenTransport), or takes over from the process it
// replaces (TransportFromFiles): memberlist's own transport binds when the
// cluster is joined, by which time a UAP could have bound the port first,
// and it cannot be given sockets that are open already. Nothing is read
// from the sockets until Join: packets wait in the kernel meanwhile.
type Transport struct {
	tcp *net.TCPListener
	udp *net.UDPConn

	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	log      *slog.Logger

	startOnce sync.Once
	stopOnce  sync.Once
	stop      chan struct{}
	stopping  atomic.Bool
	wg        sync.WaitGroup

	// dialed are the stream connections memberlist opened and has not
	// closed (joins, reliable sends): Shutdown closes them, so that a
	// peer that takes a connection and never answers does not hold the
	// node's Stop for memberlist's TCP timeout (10 s) per connection.
	dialMu sync.Mutex
	dialed map[*dialedConn]struct{}
	life   context.Context // ends at Shutdown: dials in progress end with it
	end    context.CancelFunc
}

var _ memberlist.NodeAwareTransport = (*Transport)(nil)

// udpRecvBuf is the receive buffer the name port asks for (memberlist's).
const udpRecvBuf = 2 << 20

// ListenTransport binds the name port on addr:port, TCP and UDP; port 0
// picks one that is free for both.
func ListenTransport(addr string, port int) (*Transport, error) {
	ip := net.ParseIP(addr)
	if addr != "" && ip == nil {
		return nil, fmt.Errorf("name port: bind address %q is not an IP address", addr)
	}
	tries := 1
	if port == 0 {
		tries = 10 // the port the TCP socket got may be taken for UDP
	}
	var err error
	for range tries {
		var tcp *net.TCPListener
		tcp, err = net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
		if err != nil {
			continue
		}
		p := tcp.Addr().(*net.TCPAddr).Port
		var udp *net.UDPConn
		udp, err = net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: p})
		if err != nil {
			tcp.Close()
			continue
		}
		return newTransport(tcp, udp), nil
	}
	return nil, fmt.Errorf("name port %s: %w", net.JoinHostPort(addr, strconv.Itoa(port)), err)
}

// TransportFromFiles makes a Transport of the name port's sockets another
// process handed over (its Files). It takes ownership of the files.
func TransportFromFiles(tcpF, udpF *os.File) (*Transport, error) {
	defer tcpF.Close()
	defer udpF.Close()
	ln, err := net.FileListener(tcpF)
	if err != nil {
		return nil, fmt.Errorf("name port: %w", err)
	}
	tcp, ok := ln.(*net.TCPListener)
	if !ok {
		ln.Close()
		return nil, errors.New("name port: the stream socket handed over is not a TCP listener")
	}
	pc, err := net.FilePacketConn(udpF)
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("name port: %w", err)
	}
	udp, ok := pc.(*net.UDPConn)
	if !ok || udp.LocalAddr().(*net.UDPAddr).Port != tcp.Addr().(*net.TCPAddr).Port {
		pc.Close()
		tcp.Close()
		return nil, errors.New("name port: the sockets handed over are not one UDP and one TCP socket on one port")
	}
	return newTransport(tcp, udp), nil
}

func newTransport(tcp *net.TCPListener, udp *net.UDPConn) *Transport {
	for size := udpRecvBuf; size > 0 && udp.SetReadBuffer(size) != nil; size /= 2 {
	}
	t := &Transport{
		tcp: tcp, udp: udp,
		packetCh: make(chan *memberlist.Packet),
		streamCh: make(chan net.Conn),
		log:      slog.New(slog.DiscardHandler),
		stop:     make(chan struct{}),
		dialed:   map[*dialedConn]struct{}{},
	}
	t.life, t.end = context.WithCancel(context.Background())
	return t
}

// Port is the name port.
func (t *Transport) Port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// Files duplicates the two sockets, TCP then UDP, for a process that takes
// the name port over; the caller owns them. t goes on serving on its own.
func (t *Transport) Files() (tcp, udp *os.File, err error) {
	if tcp, err = t.tcp.File(); err != nil {
		return nil, nil, fmt.Errorf("name port: %w", err)
	}
	if udp, err = t.udp.File(); err != nil {
		tcp.Close()
		return nil, nil, fmt.Errorf("name port: %w", err)
	}
	return tcp, udp, nil
}

// Close closes the sockets of a Transport that Join never took (a start
// that failed). Shutdown does it for one that memberlist runs on.
func (t *Transport) Close() { _ = t.Shutdown() }

// run starts reading the sockets; Join calls it.
func (t *Transport) run(log *slog.Logger) {
	t.startOnce.Do(func() {
		t.log = log
		t.wg.Add(2)
		go t.accept()
		go t.read()
	})
}

func (t *Transport) accept() {
	defer t.wg.Done()
	var backoff time.Duration
	for {
		c, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.stopping.Load() {
				return
			}
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			t.log.Warn("name port: accept failed", "err", err, "pause", backoff)
			select {
			case <-time.After(backoff):
				continue
			case <-t.stop:
				return
			}
		}
		backoff = 0
		select {
		case t.streamCh <- c:
		case <-t.stop:
			c.Close()
			return
		}
	}
}

func (t *Transport) read() {
	defer t.wg.Done()
	for {
		buf := make([]byte, 65536)
		n, addr, err := t.udp.ReadFrom(buf)
		now := time.Now()
		if err != nil {
			if t.stopping.Load() {
				return
			}
			t.log.Warn("name port: read failed", "err", err)
			continue
		}
		if n < 1 {
			continue
		}
		select {
		case t.packetCh <- &memberlist.Packet{Buf: buf[:n], From: addr, Timestamp: now}:
		case <-t.stop:
			return
		}
	}
}

// FinalAdvertiseAddr implements memberlist.Transport: the address given,
// else the one bound, else (bound to a wildcard) a private address of this
// host, as memberlist's own transport chooses.
func (t *Transport) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if ip != "" {
		a := net.ParseIP(ip)
		if a == nil {
			return nil, 0, fmt.Errorf("name port: advertise address %q is not an IP address", ip)
		}
		if a4 := a.To4(); a4 != nil {
			a = a4
		}
		return a, port, nil
	}
	bound := t.tcp.Addr().(*net.TCPAddr).IP
	if !bound.IsUnspecified() {
		return bound, t.Port(), nil
	}
	a, err := privateIP()
	if err != nil {
		return nil, 0, err
	}
	return a, t.Port(), nil
}

// advertiseAddr is the address Join tells memberlist to advertise for a
// name port bound to bind: bind itself when it names one address, else
// none (FinalAdvertiseAddr finds one).
func advertiseAddr(bind string) string {
	if ip := net.ParseIP(bind); ip != nil && !ip.IsUnspecified() {
		return bind
	}
	return ""
}

// CheckAdvertise reports why Join, on a name port bound to bind, would
// find no address to advertise (nil: it would), as FinalAdvertiseAddr
// finds it. A process that takes a node over asks it before it commits
// (scd's ports.claimNames): a wildcard bind advertises an address of an
// interface, which may be gone since the old process joined.
func CheckAdvertise(bind string) error {
	if advertiseAddr(bind) != "" {
		return nil
	}
	_, err := privateIP()
	return err
}

// privateIP is the first private IPv4 address of an interface that is up,
// else the first global unicast one.
func privateIP() (net.IP, error) {
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		return nil, fmt.Errorf("name port: interface addresses: %w", err)
	}
	var global net.IP
	for _, a := range addrs {
		n, ok := a.(*net.IPNet)
		if !ok || n.IP.To4() == nil || n.IP.IsLoopback() {
			continue
		}
		if n.IP.IsPrivate() {
			return n.IP.To4(), nil
		}
		if global == nil && n.IP.IsGlobalUnicast() {
			global = n.IP.To4()
		}
	}
	if global == nil {
		return nil, errors.New("name port: bound to every address and none to advertise: set rpc_address")
	}
	return global, nil
}

// WriteTo implements memberlist.Transport.
func (t *Transport) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress implements memberlist.NodeAwareTransport.
func (t *Transport) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	ua, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

// PacketCh implements memberlist.Transport.
func (t *Transport) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

// DialTimeout implements memberlist.Transport.
func (t *Transport) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout implements memberlist.NodeAwareTransport. A dial in
// progress ends when the transport shuts down, and the connection it
// returns is closed then.
func (t *Transport) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(t.life, timeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", a.Addr)
	if err != nil {
		return nil, err
	}
	dc := &dialedConn{Conn: c, t: t}
	t.dialMu.Lock()
	if t.stopping.Load() {
		t.dialMu.Unlock()
		c.Close()
		return nil, errors.New("name port: shut down")
	}
	t.dialed[dc] = struct{}{}
	t.dialMu.Unlock()
	return dc, nil
}

// dialedConn is a connection DialAddressTimeout made, known to the
// transport until it is closed.
type dialedConn struct {
	net.Conn
	t *Transport
}

func (c *dialedConn) Close() error {
	c.t.dialMu.Lock()
	delete(c.t.dialed, c)
	c.t.dialMu.Unlock()
	return c.Conn.Close()
}

// StreamCh implements memberlist.Transport.
func (t *Transport) StreamCh() <-chan net.Conn { return t.streamCh }

// Shutdown implements memberlist.Transport: it closes this process's
// sockets (a process they were handed to keeps its own) and waits for the
// readers.
func (t *Transport) Shutdown() error {
	t.stopOnce.Do(func() {
		t.dialMu.Lock()
		t.stopping.Store(true)
		dialed := t.dialed
		t.dialed = nil
		t.dialMu.Unlock()
		close(t.stop)
		t.end()
		_ = t.tcp.Close()
		_ = t.udp.Close()
		for c := range dialed {
			_ = c.Conn.Close()
		}
	})
	t.wg.Wait()
	return nil
}
