package rpcport

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// A port of the node is its own. Every receiving socket is bound with
// SO_REUSEPORT, which lets any process of the same user (root: any root
// process) bind the same port and take a share of its connections: a second
// scdd started on a copy of the definitions did so, silently. So before
// binding a group's port, Listen (and Bind) makes a probe bind without
// SO_REUSEPORT, which any listening socket on the port makes fail; and after
// binding, it checks that every socket listening on the port is one of its
// own (by inode, in /proc/net/tcp and tcp6), which closes the race of two
// processes that probe at the same moment: then both refuse. The one
// legitimate sharer is a process taking the port over (HandOff, Inherit):
// it holds the very same sockets.

// ErrPortShared is wrapped by the error of Listen and Bind when another
// socket listens on a port they were to bind.
var ErrPortShared = errors.New("taken by another socket")

// probeFree binds a socket to ip:port without SO_REUSEPORT (SO_REUSEADDR
// on, so that connections in TIME_WAIT do not count) and closes it without
// listening: the bind fails with EADDRINUSE when any socket listens there,
// whoever holds it. A nil ip is the wildcard of both families.
func probeFree(ip net.IP, port int) error {
	family := unix.AF_INET6
	var sa unix.Sockaddr
	switch ip4 := ip.To4(); {
	case ip4 != nil:
		family = unix.AF_INET
		a := &unix.SockaddrInet4{Port: port}
		copy(a.Addr[:], ip4)
		sa = a
	case ip != nil:
		a := &unix.SockaddrInet6{Port: port}
		copy(a.Addr[:], ip.To16())
		sa = a
	default:
		sa = &unix.SockaddrInet6{Port: port}
	}
	fd, err := unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil && ip == nil {
		// No IPv6 here: the wildcard is IPv4's.
		family, sa = unix.AF_INET, &unix.SockaddrInet4{Port: port}
		fd, err = unix.Socket(family, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	}
	if err != nil {
		return os.NewSyscallError("socket", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_REUSEADDR, 1); err != nil {
		return os.NewSyscallError("setsockopt SO_REUSEADDR", err)
	}
	if family == unix.AF_INET6 && ip == nil {
		_ = unix.SetsockoptInt(fd, unix.IPPROTO_IPV6, unix.IPV6_V6ONLY, 0)
	}
	return os.NewSyscallError("bind", unix.Bind(fd, sa))
}

// listenSocket is one line of /proc/net/tcp{,6} in state LISTEN.
type listenSocket struct {
	ip    net.IP
	port  int
	inode uint64
	uid   int
}

// listeningOn lists the sockets of this network namespace that listen on
// port at an address overlapping ip (the same address, or a wildcard on
// either side).
func listeningOn(ip net.IP, port int) ([]listenSocket, error) {
	var out []listenSocket
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		f, err := os.Open(file)
		if errors.Is(err, os.ErrNotExist) {
			continue // no IPv6
		}
		if err != nil {
			return nil, err
		}
		sc := bufio.NewScanner(f)
		sc.Scan() // the heading
		for sc.Scan() {
			s, ok := parseListenLine(sc.Text())
			if ok && s.port == port && overlaps(s.ip, ip) {
				out = append(out, s)
			}
		}
		err = sc.Err()
		f.Close()
		if err != nil {
			return nil, fmt.Errorf("%s: %w", file, err)
		}
	}
	return out, nil
}

// parseListenLine reads "sl local rem st ... uid timeout inode" of a
// socket in state 0A (LISTEN).
func parseListenLine(line string) (listenSocket, bool) {
	f := strings.Fields(line)
	if len(f) < 10 || f[3] != "0A" {
		return listenSocket{}, false
	}
	i := strings.LastIndexByte(f[1], ':')
	if i < 0 {
		return listenSocket{}, false
	}
	port, err := strconv.ParseUint(f[1][i+1:], 16, 16)
	if err != nil {
		return listenSocket{}, false
	}
	ip, ok := procIP(f[1][:i])
	if !ok {
		return listenSocket{}, false
	}
	uid, _ := strconv.Atoi(f[7])
	inode, err := strconv.ParseUint(f[9], 10, 64)
	if err != nil {
		return listenSocket{}, false
	}
	return listenSocket{ip: ip, port: int(port), inode: inode, uid: uid}, true
}

// procIP decodes an address of /proc/net/tcp{,6}: 32-bit words in host
// (little-endian) order.
func procIP(h string) (net.IP, bool) {
	if len(h) != 8 && len(h) != 32 {
		return nil, false
	}
	ip := make(net.IP, len(h)/2)
	for w := 0; w < len(h); w += 8 {
		for b := range 4 {
			v, err := strconv.ParseUint(h[w+2*(3-b):w+2*(3-b)+2], 16, 8)
			if err != nil {
				return nil, false
			}
			ip[w/2+b] = byte(v)
		}
	}
	return ip, true
}

// overlaps reports whether a socket bound to a can take connections meant
// for b: the same address, or a wildcard on either side.
func overlaps(a, b net.IP) bool {
	if a4 := a.To4(); a4 != nil {
		a = a4
	}
	if b4 := b.To4(); b4 != nil {
		b = b4
	}
	return a.IsUnspecified() || b.IsUnspecified() || a.Equal(b)
}

// socketInode is the inode of a socket's descriptor, as /proc/net/tcp
// lists it.
func socketInode(ln *net.TCPListener) (uint64, error) {
	raw, err := ln.SyscallConn()
	if err != nil {
		return 0, err
	}
	var st unix.Stat_t
	var serr error
	if err := raw.Control(func(fd uintptr) { serr = unix.Fstat(int(fd), &st) }); err != nil {
		return 0, err
	}
	if serr != nil {
		return 0, os.NewSyscallError("fstat", serr)
	}
	return st.Ino, nil
}

// checkOwnPort fails when a socket that is not one of ours listens on
// ip:port. ours are the inodes of this Port's sockets and of those it
// inherited (taken or not: the process that handed them over still holds
// them for a moment).
func checkOwnPort(ip net.IP, port int, ours map[uint64]bool) error {
	socks, err := listeningOn(ip, port)
	if err != nil {
		return fmt.Errorf("check that the port is this process's alone: %w", err)
	}
	for _, s := range socks {
		if !ours[s.inode] {
			return sharedPortError(ip, port, s)
		}
	}
	return nil
}

// sharedPortError names the port and, when /proc tells, who holds the
// socket listening there.
func sharedPortError(ip net.IP, port int, s listenSocket) error {
	who := fmt.Sprintf("a socket of uid %d", s.uid)
	if pid, comm := holderOf(s.inode); pid > 0 {
		who = fmt.Sprintf("process %d (%s, uid %d)", pid, comm, s.uid)
	}
	return fmt.Errorf("port %d %w: %s listens on %s; is another scdd running on these ports?",
		port, ErrPortShared, who, net.JoinHostPort(s.ip.String(), strconv.Itoa(port)))
}

// inUseError says who listens on a port a probe found taken.
func inUseError(ip net.IP, port int, err error) error {
	if ip == nil {
		ip = net.IPv4zero
	}
	if socks, lerr := listeningOn(ip, port); lerr == nil && len(socks) > 0 {
		return sharedPortError(ip, port, socks[0])
	}
	return fmt.Errorf("port %d is in use: %w", port, err)
}

// InUseError is err, a listen on addr (host:port) that failed, with the
// process that holds the address named as the RPC port's own refusal
// names it ("port 12001 taken by another socket: process 4711 (python3,
// uid 0) listens on ..."), when the address was in use and /proc tells;
// else err as it is. scdd's other TCP ports (metrics_address) use it, so
// that every port's refusal says whom to stop.
func InUseError(addr string, err error) error {
	if !errors.Is(err, unix.EADDRINUSE) {
		return err
	}
	host, ps, serr := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(ps)
	if serr != nil || perr != nil {
		return err
	}
	ip := net.ParseIP(host) // a name ("localhost") is nil: any address of the port, in inUseError
	return inUseError(ip, port, err)
}

// HolderPID is the pid of a process that listens on addr (host:port) by
// TCP, as /proc tells it; 0 when none is seen.
func HolderPID(addr string) int {
	host, ps, err := net.SplitHostPort(addr)
	port, perr := strconv.Atoi(ps)
	if err != nil || perr != nil {
		return 0
	}
	ip := net.ParseIP(host)
	if ip == nil {
		ip = net.IPv4zero
	}
	socks, err := listeningOn(ip, port)
	if err != nil {
		return 0
	}
	for _, s := range socks {
		if pid, _ := holderOf(s.inode); pid > 0 {
			return pid
		}
	}
	return 0
}

// holderOf finds a process that holds the socket with inode ino: its pid
// and command name, or 0 when none can be seen.
func holderOf(ino uint64) (int, string) {
	target := "socket:[" + strconv.FormatUint(ino, 10) + "]"
	procs, _ := filepath.Glob("/proc/[0-9]*")
	// This process first: a Port that shares a port with another part of
	// its own process is found at once.
	procs = append([]string{"/proc/" + strconv.Itoa(os.Getpid())}, procs...)
	for _, p := range procs {
		fds, err := os.ReadDir(p + "/fd")
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(p + "/fd/" + fd.Name()); err == nil && l == target {
				pid, _ := strconv.Atoi(filepath.Base(p))
				comm, _ := os.ReadFile(p + "/comm")
				return pid, strings.TrimSpace(string(comm))
			}
		}
	}
	return 0, ""
}
