package bench

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"tpsched/internal/freeport"
)

// Env is what starting the peers needs from the machine.
type Env struct {
	Bin  string // directory with scdd and uap-echo (make build)
	Self string // the harness executable, run again with -serve for the Go peers
}

// Spec sizes a peer. Every system gets the same numbers so they compete on
// equal terms on the same cores.
type Spec struct {
	Workers int // worker processes: tpsched resident UAPs, PHP-FPM children, HAProxy's Go workers
	Front   int // receiving threads/processes: scdd event loops, nginx workers, HAProxy threads, gnet loops
	Queue   int // bound on waiting calls: tpsched queue_size, PHP-FPM listen.backlog, HAProxy maxqueue (all servers)
	// S10: the caller UAPs of "tpsched local call" (the most callers of a
	// cell), and Enduro/X's exbenchsv processes in every cell (0: as many
	// as the cell's callers, the 1x1 and 5x5 of its published figures).
	Callers        int
	EnduroXServers int
}

// system is one running peer.
type system struct {
	Name  string // as reported
	Addr  string
	dial  func(service string) dialer
	dir   string
	procs []*exec.Cmd
	// workers counts the worker processes now (S3); nil where not known.
	workers func() (int, error)
	// status is tpsched's GET /status URL on its control address (S5);
	// empty for the other systems.
	status string
	// drive, if set, runs a cell's load from processes of the system's
	// own instead of the harness's callers (S10's caller UAPs, Enduro/X's
	// exbenchcl) and samples the window with w.begin and w.end.
	drive func(ctx context.Context, o runOptions, c *gridCell, w *window) (result, error)
	// skip, if set, says why the system is not measured in a cell ("" if it is).
	skip func(c gridCell) string
	// pids are root processes not started by procs (Enduro/X's ndrxd,
	// which xadmin starts as a daemon).
	pids []int
	// stop, if set, runs first in Stop (Enduro/X's xadmin stop and down).
	stop func()
	// stopped are the pids pause stopped, until resume (pause.go); under
	// running's lock.
	stopped map[int]bool
}

// Workers counts the system's worker processes now: tpsched's UAP
// processes (from /status), PHP-FPM's children of the master.
func (s *system) Workers() (int, error) {
	if s.workers == nil {
		return 0, fmt.Errorf("%s: no worker count", s.Name)
	}
	return s.workers()
}

// Dialer returns a dialer for service "echo" or "burn".
func (s *system) Dialer(service string) dialer { return s.dial(service) }

// Roots are the pids whose process trees are the server.
func (s *system) Roots() []int {
	out := slices.Clone(s.pids)
	for _, c := range s.procs {
		if c.Process != nil {
			out = append(out, c.Process.Pid)
		}
	}
	return out
}

// Stop ends the peer's processes (SIGTERM, then SIGKILL to their process
// groups after 5 s) and removes its directory.
func (s *system) Stop() {
	running.Lock()
	delete(running.set, s)
	running.Unlock()
	s.resume() // a stopped process would not act on SIGTERM
	if s.stop != nil {
		s.stop()
	}
	for i := len(s.procs) - 1; i >= 0; i-- {
		c := s.procs[i]
		if c.Process == nil {
			continue
		}
		c.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
			<-done
		}
		// Anything the process left in its group (nginx or php-fpm workers).
		syscall.Kill(-c.Process.Pid, syscall.SIGKILL)
	}
	if s.dir != "" {
		os.RemoveAll(s.dir)
	}
}

// Log returns the tail of the peer's log files, for error messages.
func (s *system) Log() string {
	var b strings.Builder
	logs, _ := filepath.Glob(filepath.Join(s.dir, "*.log"))
	for _, l := range logs {
		data, _ := os.ReadFile(l)
		if len(data) > 2000 {
			data = data[len(data)-2000:]
		}
		if len(bytes.TrimSpace(data)) > 0 {
			fmt.Fprintf(&b, "--- %s\n%s\n", filepath.Base(l), data)
		}
	}
	return b.String()
}

func (s *system) start(log string, env []string, name string, args ...string) error {
	f, err := os.Create(filepath.Join(s.dir, log))
	if err != nil {
		return err
	}
	defer f.Close()
	c := exec.Command(name, args...)
	c.Dir = s.dir
	c.Stdout, c.Stderr = f, f
	c.Env = append(os.Environ(), env...)
	c.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.Start(); err != nil {
		return fmt.Errorf("%s: %w", filepath.Base(name), err)
	}
	s.procs = append(s.procs, c)
	return nil
}

// ready waits until a call to echo (or burn 0) succeeds, so the whole path
// (nginx to PHP-FPM, HAProxy to its workers) is up.
func (s *system) ready(service string) error {
	payload := []byte("1")
	deadline := time.Now().Add(20 * time.Second)
	for {
		c := s.dial(service)()
		o, err := c.Call(payload, time.Now().Add(2*time.Second))
		c.Close()
		if err == nil && o == callOK {
			return nil
		}
		for _, p := range s.procs {
			if p.ProcessState != nil {
				return fmt.Errorf("%s exited: %v\n%s", s.Name, p.ProcessState, s.Log())
			}
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s did not answer (last outcome %d, %v)\n%s", s.Name, o, err, s.Log())
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func newSystem(name string) (*system, error) {
	dir, err := os.MkdirTemp("", "tpbench-*")
	if err != nil {
		return nil, err
	}
	// nginx workers and PHP-FPM children may run as another user.
	os.Chmod(dir, 0o755)
	s := &system{Name: name, dir: dir}
	running.Lock()
	running.set[s] = true
	running.Unlock()
	return s, nil
}

// running holds every system started and not yet stopped, so a run can
// count what the systems it does not measure spend meanwhile.
var running = struct {
	sync.Mutex
	set map[*system]bool
}{set: map[*system]bool{}}

// othersRoots are the root pids of every running system but s.
func othersRoots(s *system) []int {
	running.Lock()
	defer running.Unlock()
	var out []int
	for o := range running.set {
		if o != s {
			out = append(out, o.Roots()...)
		}
	}
	return out
}

// startSystem makes the system name, picks the address it will listen on
// (reached by the load generator with dial) and starts it with start; it
// returns once the system answers an echo call, and stops what was
// started if it does not.
func startSystem(name string, dial func(addr, svc string) dialer, start func(s *system, addr string) error) (*system, error) {
	s, err := newSystem(name)
	if err != nil {
		return nil, err
	}
	return launch(s, "echo", func() error {
		addr, err := s.takeAddr(dial)
		if err != nil {
			return err
		}
		return start(s, addr)
	})
}

// launch finishes starting s and, unless probe is "", waits until a call
// to probe succeeds; on error it stops what was started.
func launch(s *system, probe string, start func() error) (*system, error) {
	err := start()
	if err == nil && probe != "" {
		err = s.ready(probe)
	}
	if err != nil {
		s.Stop()
		return nil, err
	}
	return s, nil
}

// takeAddr picks the free address the system will listen on and how the
// load generator reaches each of its services there.
func (s *system) takeAddr(dial func(addr, svc string) dialer) (string, error) {
	addr, err := freeport.Addr()
	if err != nil {
		return "", err
	}
	s.Addr = addr
	s.dial = func(svc string) dialer { return dial(addr, svc) }
	return addr, nil
}

// httpDial reaches service svc at path /svc.
func httpDial(addr, svc string) dialer { return httpDialer(addr, "/"+svc) }

// The peers' names as they appear in reports.
const (
	nameTpsched = "tpsched"
	// The same node with the C UAP (uap-c/, examples/uap-c) in place of
	// the Go one: what a UAP's language costs.
	nameTpschedC = "tpsched C UAP"
	// S10: local calls alone: caller UAPs (cmd/uap-caller) on the node,
	// each calling bench/echo in a loop through its shared memory
	// (shm.UAP.Call), as Enduro/X's exbenchcl does.
	nameTpschedLocal = "tpsched local call"
	// S10: the same local calls with both sides in C (uap-caller-c calling
	// uap-echo-c), as Enduro/X's exbenchcl and exbenchsv are: what the
	// UAPs' language runtime costs a local call.
	nameTpschedLocalC = "tpsched C local call"
	// S10: the echo reached through a second UAP's local call: client ->
	// scdd -> front UAP -> scdd -> bench UAP, and back.
	nameTpschedNested = "tpsched nested call"
	nameGnetEcho      = "gnet-echo"
	nameGRPC          = "grpc-go"
	namePHPStatic     = "nginx+php-fpm static"
	namePHPDyn        = "nginx+php-fpm dynamic"
	nameHAProxy       = "haproxy+go"
	// S3's pools that grow with the load.
	nameTpschedNonRes = "tpsched non-resident"
	namePHPOndemand   = "nginx+php-fpm ondemand"
	// S5's two tpsched definitions: the CPU guard at its limit, and off.
	nameTpschedGuard    = "tpsched guard"
	nameTpschedGuardOff = "tpsched guard off"
)

// startTpsched starts scdd with one group "bench" (services echo and burn)
// served by sp.Workers resident uap-echo processes.
func startTpsched(env Env, sp Spec) (*system, error) {
	return startTpschedConf(env, sp, nameTpsched, "uap-echo", fmt.Sprint(sp.Workers), "")
}

// startTpschedC is startTpsched with the C example UAP, uap-echo-c (make
// build makes it when there is a C compiler).
func startTpschedC(env Env, sp Spec) (*system, error) {
	return startTpschedConf(env, sp, nameTpschedC, "uap-echo-c", fmt.Sprint(sp.Workers), "")
}

// startTpschedNonResident starts scdd with the group "bench" served by
// parallel_count = resident,max uap-echo processes: resident ones always,
// the others non-resident, started and stopped by the balance_count rule
// and stopped after idling idle.
func startTpschedNonResident(env Env, sp Spec, resident, maxProcs, balance int, idle time.Duration) (*system, error) {
	return startTpschedConf(env, sp, nameTpschedNonRes, "uap-echo", fmt.Sprintf("%d,%d", resident, maxProcs),
		fmt.Sprintf("set balance_count = %d\nset nonresident_idle_time = %d\n", balance, idle.Milliseconds()))
}

// startTpschedGuard starts scdd with the group "bench" served by
// parallel_count = resident,max uap-echo processes, the balance_count rule
// and cpu_wait_limit = waitLimit (0: the CPU guard off), as system name.
func startTpschedGuard(env Env, sp Spec, name string, resident, maxProcs, balance, waitLimit int) (*system, error) {
	return startTpschedConf(env, sp, name, "uap-echo", fmt.Sprintf("%d,%d", resident, maxProcs),
		fmt.Sprintf("set balance_count = %d\nset cpu_wait_limit = %d\n", balance, waitLimit))
}

func startTpschedConf(env Env, sp Spec, name, module, parallel, usrExtra string) (*system, error) {
	return startTpschedWith(env, sp, tpschedConf{name: name, module: module, parallel: parallel, usrExtra: usrExtra})
}

// tpschedConf is what a tpsched system's definitions and process have
// beyond Spec.
type tpschedConf struct {
	name, module, parallel string
	front                  bool     // a second group, front, whose call service calls bench/echo; the calls go to it
	callers                int      // a group callers of that many caller processes (S10's local calls)
	callerModule           string   // the callers' program: uap-caller if empty
	usrExtra               string   // more lines of usr/bench
	sysExtra               string   // more lines of sysconf
	environ                []string // more of scdd's environment
}

func startTpschedWith(env Env, sp Spec, tc tpschedConf) (*system, error) {
	dial := func(addr, svc string) dialer { return tpschedDialer(addr, "bench", svc) }
	if tc.front {
		dial = func(addr, svc string) dialer { return tpschedCallDialer(addr, "front", "call", "bench/"+svc+"/") }
	}
	return startSystem(tc.name, dial, func(s *system, rpc string) error {
		ctl, err := freeport.Addr()
		if err != nil {
			return err
		}
		host, port, _ := net.SplitHostPort(rpc)
		uap, err := filepath.Abs(filepath.Join(env.Bin, tc.module))
		if err != nil {
			return err
		}
		if _, err := os.Stat(uap); err != nil {
			return fmt.Errorf("the UAP %s: %w (make build makes it)", tc.module, err)
		}
		scdd, err := filepath.Abs(filepath.Join(env.Bin, "scdd"))
		if err != nil {
			return err
		}
		files := map[string]string{
			// A control socket of its own (in the definition directory):
			// two tpsched systems run side by side, and the default path
			// is per node id.
			"conf/sysconf": fmt.Sprintf("set rpc_address = %q\nset rpc_port = %s\nset metrics_address = %q\nset control_socket = %q\n%s",
				host, port, ctl, tpschedControlSock, tc.sysExtra),
			"conf/scdsvcdef": fmt.Sprintf("set scdmulti = %d\n", sp.Front),
			"conf/usr/bench": fmt.Sprintf("set service_group = \"bench\"\nset service = \"echo=echo\", \"burn=burn\", \"cpu=cpu\"\n"+
				"set module = %q\nset parallel_count = %s\nset queue_size = %d\nset max_message_size = 1048576\n%s",
				uap, tc.parallel, sp.Queue, tc.usrExtra),
		}
		if tc.front {
			files["conf/usr/front"] = fmt.Sprintf("set service_group = \"front\"\nset service = \"call=call\"\n"+
				"set module = %q\nset parallel_count = %d\nset queue_size = %d\nset max_message_size = 1048576\n", uap, s10Front, sp.Queue)
		}
		if tc.callers > 0 {
			caller, err := filepath.Abs(filepath.Join(env.Bin, cmp.Or(tc.callerModule, "uap-caller")))
			if err != nil {
				return err
			}
			if _, err := os.Stat(caller); err != nil {
				return fmt.Errorf("the caller UAP: %w (make bench builds it)", err)
			}
			files["conf/usr/callers"] = fmt.Sprintf("set service_group = %q\nset service = \"run=run\"\n"+
				"set module = %q\nset parallel_count = %d\nset queue_size = %d\nset max_message_size = 1048576\n",
				callersGroup, caller, tc.callers, max(sp.Queue, tc.callers))
		}
		if err := writeFiles(s.dir, files); err != nil {
			return err
		}
		s.status = "http://" + ctl + "/status"
		s.workers = func() (int, error) { return tpschedWorkers(s.status, "bench") }
		return s.start("scdd.log", tc.environ, scdd, "-c", filepath.Join(s.dir, "conf"), "-log-level", "warn")
	})
}

// tpschedControlSock is a tpsched system's control socket, relative to its
// definition directory (conf/).
const tpschedControlSock = "ctl.sock"

// startGnetEcho starts the bare gnet echo server (the ceiling: no queue, no
// process boundary) with sp.Front event loops.
func startGnetEcho(env Env, sp Spec) (*system, error) {
	return startSelf(env, nameGnetEcho, "gnet", sp.Front, func(addr, svc string) dialer {
		return tpschedDialer(addr, "bench", svc)
	})
}

// startGRPC starts the gRPC-go echo server (one process, GOMAXPROCS =
// sp.Workers).
func startGRPC(env Env, sp Spec) (*system, error) {
	return startSelf(env, nameGRPC, "grpc", sp.Workers, func(addr, svc string) dialer {
		return grpcDialer(addr, strings.ToUpper(svc[:1])+svc[1:])
	})
}

func startSelf(env Env, name, kind string, procs int, dial func(addr, svc string) dialer) (*system, error) {
	return startSystem(name, dial, func(s *system, addr string) error {
		return s.start(kind+".log", []string{fmt.Sprintf("GOMAXPROCS=%d", procs)},
			env.Self, "-serve", kind, "-addr", addr, "-loops", fmt.Sprint(procs))
	})
}

// PHP scripts: echo answers the request body; burn spins for the
// microseconds the body names, then answers it.
const (
	phpEcho = `<?php
$b = file_get_contents('php://input');
header('Content-Type: application/octet-stream');
header('Content-Length: ' . strlen($b));
echo $b;
`
	phpBurn = `<?php
$b = file_get_contents('php://input');
$end = hrtime(true) + 1000 * (int)$b;
$x = 1;
while (hrtime(true) < $end) {
	for ($i = 0; $i < 100; $i++) { $x = ($x * 1103515245 + 12345) & 0x7fffffff; }
}
header('Content-Type: application/octet-stream');
header('Content-Length: ' . strlen($b));
echo $b;
`
)

// findBinary looks the peer binaries up on $PATH and in
// /usr/sbin, where Debian puts them.
func findBinary(names ...string) (string, error) {
	for _, n := range names {
		if p, err := exec.LookPath(n); err == nil {
			return p, nil
		}
		if p := filepath.Join("/usr/sbin", n); isExec(p) {
			return p, nil
		}
	}
	return "", fmt.Errorf("%s not installed (make bench-deps)", names[0])
}

func isExec(p string) bool {
	st, err := os.Stat(p)
	return err == nil && st.Mode().IsRegular() && st.Mode()&0o111 != 0
}

func phpFPMBinary() (string, error) {
	if p, err := findBinary("php-fpm"); err == nil {
		return p, nil
	}
	m, _ := filepath.Glob("/usr/sbin/php-fpm*")
	if len(m) > 0 {
		return m[len(m)-1], nil
	}
	return "", errors.New("php-fpm not installed (make bench-deps)")
}

// startNginxPHP starts nginx (sp.Front workers) passing requests over
// FastCGI (a unix socket, no keep-alive to PHP-FPM, as the stock
// configuration does) to a PHP-FPM pool: pm=static with sp.Workers
// children, or pm=dynamic with 1..4x sp.Workers children.
func startNginxPHP(env Env, sp Spec, dynamic bool) (*system, error) {
	name := namePHPStatic
	pm := fmt.Sprintf("pm = static\npm.max_children = %d\n", sp.Workers)
	if dynamic {
		name = namePHPDyn
		pm = fmt.Sprintf("pm = dynamic\npm.max_children = %d\npm.start_servers = %d\npm.min_spare_servers = 1\npm.max_spare_servers = %d\n",
			4*sp.Workers, sp.Workers, 2*sp.Workers)
	}
	return startNginxPHPPool(env, sp, name, pm)
}

// startNginxPHPPool is StartNginxPHP with the pool's process manager
// settings (the pm.* lines of php-fpm.conf) given whole.
func startNginxPHPPool(env Env, sp Spec, name, pm string) (*system, error) {
	nginx, err := findBinary("nginx")
	if err != nil {
		return nil, err
	}
	fpm, err := phpFPMBinary()
	if err != nil {
		return nil, err
	}
	return startSystem(name, httpDial, func(s *system, addr string) error {
		sock := filepath.Join(s.dir, "php.sock")
		files := map[string]string{
			"www/echo.php": phpEcho,
			"www/burn.php": phpBurn,
			"php-fpm.conf": fmt.Sprintf(`[global]
pid = %[1]s/php-fpm.pid
error_log = %[1]s/php-fpm.log
daemonize = no
[bench]
user = root
group = root
listen = %[2]s
listen.mode = 0666
listen.backlog = %[3]d
%[4]spm.max_requests = 0
clear_env = no
`, s.dir, sock, sp.Queue, pm),
			"nginx.conf": fmt.Sprintf(`worker_processes %[3]d;
daemon off;
master_process on;
pid %[1]s/nginx.pid;
error_log %[1]s/nginx.log warn;
user root root;
events { worker_connections 8192; }
http {
	access_log off;
	client_body_temp_path %[1]s/tmp-body;
	fastcgi_temp_path %[1]s/tmp-fastcgi;
	proxy_temp_path %[1]s/tmp-proxy;
	uwsgi_temp_path %[1]s/tmp-uwsgi;
	scgi_temp_path %[1]s/tmp-scgi;
	keepalive_requests 100000000;
	keepalive_timeout 600s;
	client_body_buffer_size 128k;
	client_max_body_size 4m;
	fastcgi_buffer_size 128k;
	fastcgi_buffers 4 128k;
	fastcgi_busy_buffers_size 256k;
	server {
		listen %[2]s;
		root %[1]s/www;
		location / {
			fastcgi_pass unix:%[4]s;
			fastcgi_param SCRIPT_FILENAME %[1]s/www$uri.php;
			fastcgi_param SCRIPT_NAME $uri;
			fastcgi_param REQUEST_METHOD $request_method;
			fastcgi_param REQUEST_URI $request_uri;
			fastcgi_param QUERY_STRING $query_string;
			fastcgi_param CONTENT_TYPE $content_type;
			fastcgi_param CONTENT_LENGTH $content_length;
			fastcgi_param SERVER_PROTOCOL $server_protocol;
			fastcgi_param GATEWAY_INTERFACE CGI/1.1;
		}
	}
}
`, s.dir, addr, sp.Front, sock),
		}
		if err := writeFiles(s.dir, files); err != nil {
			return err
		}
		if err := s.start("php-fpm-out.log", nil, fpm, "-F", "-R", "-y", filepath.Join(s.dir, "php-fpm.conf"), "-p", s.dir); err != nil {
			return err
		}
		master := s.procs[len(s.procs)-1].Process.Pid
		s.workers = func() (int, error) { return len(childrenOf(master)), nil }
		return s.start("nginx-out.log", nil, nginx, "-p", s.dir+"/", "-e", filepath.Join(s.dir, "nginx.log"),
			"-c", filepath.Join(s.dir, "nginx.conf"))
	})
}

// startHAProxy starts sp.Workers Go HTTP worker processes (GOMAXPROCS=1
// each) and HAProxy (sp.Front threads) balancing over them with leastconn.
// Each worker takes at most 4 requests at a time; the rest wait in
// HAProxy's queue. When sp.Queue is under 1024 a request that finds
// sp.Queue requests queued is answered 503.
func startHAProxy(env Env, sp Spec) (*system, error) {
	haproxy, err := findBinary("haproxy")
	if err != nil {
		return nil, err
	}
	return startSystem(nameHAProxy, httpDial, func(s *system, addr string) error {
		var servers strings.Builder
		shed := ""
		if sp.Queue < 1024 {
			// maxqueue alone only redispatches to the backend's unbounded
			// queue; shedding on the queue length is what bounds it.
			shed = fmt.Sprintf("\thttp-request deny deny_status 503 if { queue(be) ge %d }\n", sp.Queue)
		}
		for i := range sp.Workers {
			w, err := freeport.Addr()
			if err != nil {
				return err
			}
			if err := s.start(fmt.Sprintf("worker%d.log", i), []string{"GOMAXPROCS=1"},
				env.Self, "-serve", "http", "-addr", w); err != nil {
				return err
			}
			fmt.Fprintf(&servers, "\tserver w%d %s maxconn 4\n", i, w)
		}
		cfg := fmt.Sprintf(`global
	nbthread %d
	maxconn 4000
defaults
	mode http
	timeout connect 5s
	timeout client 600s
	timeout server 600s
	timeout queue 10s
	timeout http-keep-alive 600s
frontend fe
	bind %s
%s	default_backend be
backend be
	balance leastconn
	http-reuse always
%s`, sp.Front, addr, shed, servers.String())
		if err := writeFiles(s.dir, map[string]string{"haproxy.cfg": cfg}); err != nil {
			return err
		}
		return s.start("haproxy.log", nil, haproxy, "-db", "-f", filepath.Join(s.dir, "haproxy.cfg"))
	})
}

func writeFiles(dir string, files map[string]string) error {
	for name, body := range files {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			return err
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			return err
		}
	}
	return nil
}

// peerChoices says how each system in names is configured and why: the
// report prints it, since a comparison is only worth its weakest peer's
// setup. The choices not taken were measured on the 2-core VM, same
// server, interleaved runs on a quiet machine.
func peerChoices(sp Spec, names []string) []string {
	choices := map[string]string{
		nameTpsched: fmt.Sprintf("tpsched: scdd with scdmulti=%d event loops and one group of parallel_count=%d resident uap-echo processes (Go), "+
			"queue_size=%d, every other operand at its default (the CPU guard on). Resident processes are what an OpenTP1 user runs for a steady load.",
			sp.Front, sp.Workers, sp.Queue),
		nameTpschedLocal: fmt.Sprintf("tpsched local call: as tpsched, plus a group callers of %d resident uap-caller processes (bench/cmd/uap-caller, Go, the public "+
			"UAP API only). For a cell of N callers the harness sends a run call to N of them; each then calls bench/echo in a loop through the node "+
			"(shm.UAP.Call: its shared memory, no socket) until the run's end, as exbenchcl does, and answers with its counts and a latency "+
			"histogram (buckets 1/64 wide). The callers are the load generator: their CPU, context switches and system calls are counted as "+
			"such, the idle ones with the idle systems.", sp.Callers),
		nameTpschedLocalC: fmt.Sprintf("tpsched C local call: as tpsched local call, with both sides in C as Enduro/X's are: %d resident "+
			"uap-caller-c (bench/cmd/uap-caller-c, the C UAP library's tpsched_call_service) calling %d resident uap-echo-c (gcc -O2); the same "+
			"run request, payload, window rules and histogram as the Go callers.", sp.Callers, sp.Workers),
		nameTpschedNested: fmt.Sprintf("tpsched nested call: as tpsched, plus a group front of %d resident uap-echo processes (each waits for its own local call) whose call "+
			"service calls bench/echo through the node from its handler (shm.UAP.Call); the client calls front/call over TCP, so each call is two "+
			"scheduled calls, one of them a local call.", s10Front),
		nameEnduroX: enduroxChoice(sp),
		nameTpschedC: fmt.Sprintf("tpsched C UAP: as tpsched, with the example C UAP uap-echo-c (uap-c/, gcc -O2) in place of the Go one: "+
			"the same node, %d resident processes.", sp.Workers),
		nameGnetEcho: fmt.Sprintf("gnet echo: the ceiling, no queue and no process boundary: %d gnet event loops (SO_REUSEPORT, TCP_NODELAY), "+
			"GOMAXPROCS=%d, each read's calls answered on the loop in one write.", sp.Front, sp.Front),
		nameGRPC: fmt.Sprintf("gRPC-go: one process, grpc.NewServer() with its defaults, GOMAXPROCS=%d, unary methods taking and returning a "+
			"protobuf BytesValue. The load generator speaks gRPC over HTTP/2 by hand (grpc-go's own client spent 20-26 us of CPU per call on the "+
			"shared cores, the hand-written one 14, and the server gained 15-25%%). Tried and not taken: NumStreamWorkers(%d) (server CPU per call "+
			"about 10%% lower, calls/s within the noise; an experimental API); GOMAXPROCS=1 (the same median at 64 connections with less spread, "+
			"about 20%% more calls/s at one connection; kept at %d so that every peer has the same ceiling of receiving threads).",
			sp.Workers, sp.Workers, sp.Workers),
		namePHPStatic: fmt.Sprintf("nginx + PHP-FPM: nginx worker_processes=%d, keep-alive to the clients, access_log off; FastCGI over a unix "+
			"socket with a connection per request (with fastcgi_keep_conn, an nginx worker holds a child on an idle connection and the other "+
			"worker's requests wait behind it); PHP-FPM pm=static with %d children (none forked during a run), pm.max_requests=0, OPcache on "+
			"(Debian's php.ini), listen.backlog=%d.", sp.Front, sp.Workers, sp.Queue),
		namePHPDyn: fmt.Sprintf("nginx + PHP-FPM dynamic: as static, but pm=dynamic from %d to %d children (start %d, spare 1 to %d): the pool "+
			"a PHP user runs when the load varies.", 1, 4*sp.Workers, sp.Workers, 2*sp.Workers),
		nameHAProxy: fmt.Sprintf("HAProxy + Go workers: HAProxy nbthread=%d, balance leastconn, http-reuse always, over %d Go net/http worker "+
			"processes (GOMAXPROCS=1 each) with maxconn 4 each, so waiting requests queue in HAProxy, where leastconn can place them.",
			sp.Front, sp.Workers),
	}
	var out []string
	for _, n := range names {
		if c, ok := choices[n]; ok {
			out = append(out, c)
		}
	}
	return out
}
