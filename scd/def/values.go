package def

import (
	"errors"
	"fmt"
	"net"
	"os/user"
	"strconv"
	"strings"
	"time"
)

// Limits on names, chosen for this implementation (the documents give none
// but the 128-node limit): OpenTP1 identifiers are at most 31 bytes.
const (
	maxNameLen    = 31   // service_group, service names and entries, node_id
	maxModuleLen  = 4095 // module: a path
	maxParallel   = 1024 // parallel_count max
	maxBalance    = 4096 // balance_count
	maxMulti      = 64   // receiving sockets of one receiver group (scdmulti)
	maxQueueSize  = 65536
	maxQueueCount = 32767   // levelup/leveldown_queue_count values
	maxSeconds    = 65535   // watch_time, loadcheck_interval, dccltcachetim
	maxPriority   = 16      // schedule_priority: 1 highest .. 16 lowest
	maxPids       = 1 << 22 // uap_pids_max: Linux's largest pid_max
	minMessage    = 1 << 10
	maxCache      = 4096 // dccache
)

// uap_cpu_groups' values (System.UAPCPUGroups).
const (
	CPUGroupsPriority = "priority" // a server's own cpu cgroup (v1) only where a weight asks for one
	CPUGroupsAlways   = "always"   // every server's own cpu cgroup
)

// SplitHostPort splits "host", "host:port", "[v6]:port" or a bare IPv6
// address into host and port. A missing port is defaultPort; with
// defaultPort <= 0 the port is required. Ports are 1..65535. The host must be
// an IP address or a host name (letters, digits, '-', '_' and dots).
func SplitHostPort(hostport string, defaultPort int) (string, int, error) {
	if hostport == "" {
		return "", 0, errors.New("empty address")
	}
	host, port, hasPort := hostport, "", false
	switch {
	case strings.HasPrefix(hostport, "["):
		end := strings.IndexByte(hostport, ']')
		if end < 0 {
			return "", 0, fmt.Errorf("missing ']' in %q", shown(hostport))
		}
		host = hostport[1:end]
		if rest := hostport[end+1:]; rest != "" {
			if rest[0] != ':' {
				return "", 0, fmt.Errorf("unexpected %q after ']' in %q", shown(rest), shown(hostport))
			}
			port, hasPort = rest[1:], true
		}
		if ip := net.ParseIP(host); ip == nil || !strings.Contains(host, ":") {
			return "", 0, fmt.Errorf("%q in brackets is not an IPv6 address", shown(host))
		}
	case strings.Count(hostport, ":") > 1:
		if net.ParseIP(hostport) == nil {
			return "", 0, fmt.Errorf("bad address %q (write an IPv6 address with a port as [addr]:port)", shown(hostport))
		}
	case strings.Contains(hostport, ":"):
		i := strings.IndexByte(hostport, ':')
		host, port, hasPort = hostport[:i], hostport[i+1:], true
	}
	if host == "" {
		return "", 0, fmt.Errorf("missing host in %q", shown(hostport))
	}
	if !validHost(host) {
		return "", 0, fmt.Errorf("bad host %q", shown(host))
	}
	if !hasPort {
		if defaultPort <= 0 {
			return "", 0, fmt.Errorf("missing port in %q (want host:port)", shown(hostport))
		}
		return host, defaultPort, nil
	}
	p, err := parseUint(port, 1, 65535)
	if err != nil {
		return "", 0, fmt.Errorf("port in %q: %w", shown(hostport), err)
	}
	return host, p, nil
}

// validHost reports whether h is an IP address or a plausible host name.
func validHost(h string) bool {
	if net.ParseIP(h) != nil {
		return true
	}
	if len(h) > 253 {
		return false
	}
	for _, label := range strings.Split(h, ".") {
		if label == "" || len(label) > 63 {
			return false
		}
		for i := 0; i < len(label); i++ {
			c := label[i]
			if !(c == '-' || c == '_' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')) {
				return false
			}
		}
	}
	return true
}

// checkIdent reports why s is not a name: 1..maxNameLen bytes of letters,
// digits, '_', '-' and '.'.
func checkIdent(what, s string) error {
	if s == "" {
		return fmt.Errorf("empty %s", what)
	}
	if len(s) > maxNameLen {
		if _, cut := shown(s).head(); cut { // shown says the length
			return fmt.Errorf("%s %q, at most %d", what, shown(s), maxNameLen)
		}
		return fmt.Errorf("%s %q is %d bytes, at most %d", what, s, len(s), maxNameLen)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c == '-' || c == '_' || c == '.' || ('a' <= c && c <= 'z') || ('A' <= c && c <= 'Z') || ('0' <= c && c <= '9')) {
			return fmt.Errorf("%s %q: %q not allowed (letters, digits, '_', '-', '.')", what, shown(s), c)
		}
	}
	return nil
}

func parseUint(s string, lo, hi int) (int, error) {
	if s == "" {
		return 0, errors.New("empty number")
	}
	for i := 0; i < len(s); i++ {
		if s[i] < '0' || s[i] > '9' {
			return 0, fmt.Errorf("want an unsigned integer, got %q", shown(s))
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < lo || n > hi {
		return 0, fmt.Errorf("%s out of range %d..%d", shown(s), lo, hi)
	}
	return n, nil
}

func one(v []string) (string, error) {
	if len(v) != 1 {
		return "", fmt.Errorf("want one value, got %d", len(v))
	}
	return v[0], nil
}

func intIn(v []string, lo, hi int) (int, error) {
	s, err := one(v)
	if err != nil {
		return 0, err
	}
	return parseUint(s, lo, hi)
}

func secondsIn(v []string, lo, hi int) (time.Duration, error) {
	n, err := intIn(v, lo, hi)
	return time.Duration(n) * time.Second, err
}

func boolYN(v []string) (bool, error) {
	s, err := one(v)
	if err != nil {
		return false, err
	}
	switch strings.ToUpper(s) {
	case "Y":
		return true, nil
	case "N":
		return false, nil
	}
	return false, fmt.Errorf("want Y or N, got %q", shown(s))
}

// maxID is the largest user or group id: (uid_t)-1 means "unchanged" to
// the kernel.
const maxID = 1<<32 - 2

// lookupUserID is user.LookupId (a variable for the test of a user whose
// primary group is root).
var lookupUserID = user.LookupId

// primaryGID is the group the processes of a server with uid and no gid
// run as: the user's primary group, or, for a uid with no passwd entry,
// the group of the same number (the daemon's own group, which is root's
// for a root scdd, was what they got).
func primaryGID(uid int) int {
	if u, err := lookupUserID(strconv.Itoa(uid)); err == nil {
		if gid, err := strconv.Atoi(u.Gid); err == nil {
			return gid
		}
	}
	return uid
}

// lookupID reads a user (kind "user") or group (kind "group") given by
// name or number: a name must exist on this machine; a number is taken as
// it is.
func lookupID(v []string, kind string) (int, error) {
	s, err := one(v)
	if err != nil {
		return 0, err
	}
	if s != "" && strings.Trim(s, "0123456789") == "" {
		return parseUint(s, 0, maxID)
	}
	if s == "" {
		return 0, fmt.Errorf("empty %s name", kind)
	}
	if n := strings.TrimLeft(s, "+-"); n != s && n != "" && strings.Trim(n, "0123456789") == "" {
		// A signed number, -1 say, is no name that could exist.
		return 0, fmt.Errorf("%q: want a %s name or a number 0..%d", shown(s), kind, maxID)
	}
	var id string
	if kind == "user" {
		var u *user.User
		if u, err = user.Lookup(s); err == nil {
			id = u.Uid
		}
	} else {
		var g *user.Group
		if g, err = user.LookupGroup(s); err == nil {
			id = g.Gid
		}
	}
	var unknownUser user.UnknownUserError
	var unknownGroup user.UnknownGroupError
	switch {
	case errors.As(err, &unknownUser) || errors.As(err, &unknownGroup):
		return 0, fmt.Errorf("no %s %q on this machine", kind, shown(s))
	case err != nil:
		return 0, fmt.Errorf("looking up %s %q: %w", kind, shown(s), err)
	}
	n, err := strconv.Atoi(id)
	if err != nil || n < 0 || n > maxID {
		return 0, fmt.Errorf("%s %q has id %q, want 0..%d", kind, shown(s), id, maxID)
	}
	return n, nil
}

// pair reads "a,b" with both values in lo..hi.
func pair(v []string, lo, hi int) ([2]int, error) {
	var p [2]int
	if len(v) != 2 {
		return p, fmt.Errorf("want two values, got %d", len(v))
	}
	for i := range p {
		n, err := parseUint(v[i], lo, hi)
		if err != nil {
			return p, err
		}
		p[i] = n
	}
	return p, nil
}
