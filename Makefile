# tpsched: `make help` lists the targets.
GO      ?= go
BIN     ?= bin
GOFLAGS ?=
# -version of every binary: git's description of the tree, else (no git)
# what the Go toolchain stamps (internal/version).
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null)
LDFLAGS := $(if $(VERSION),-X tpsched/internal/version.Version=$(VERSION))

# Where make install puts things (DESTDIR is prepended to each).
PREFIX       ?= /usr/local
BINDIR       ?= $(PREFIX)/bin
LIBDIR       ?= $(PREFIX)/lib
INCLUDEDIR   ?= $(PREFIX)/include
PKGCONFIGDIR ?= $(LIBDIR)/pkgconfig
DOCDIR       ?= $(PREFIX)/share/doc/tpsched
UNITDIR      ?= $(PREFIX)/lib/systemd/system
SYSCONFDIR   ?= /etc
# What make install copies into DOCDIR, by name and in the repository's
# layout (so the README's links work there): tracked files only, never
# what a build or a run left beside them (a UAP built into aplib/, a
# control socket). itest's TestMakeInstallIntoDestDir holds EXAMPLES to
# `git ls-files examples`: add a new example file here.
DOCS     := README.md docs/ARCHITECTURE.md docs/OPERANDS.md docs/RELIABILITY.md docs/SHM.md docs/WARNINGS.md \
	docs/NODE.md docs/CLUSTER.md docs/UAP.md docs/METRICS.md docs/OPERATING.md docs/TESTING.md \
	docs/img/dashboard.png docs/img/status-page.png dist/grafana/tpsched.json dist/tpsched.service
EXAMPLES := examples/client-go/betranrc examples/client-go/go.mod examples/client-go/go.sum examples/client-go/main.go \
	examples/twogroups/scdsvcdef examples/twogroups/sysconf examples/twogroups/usr/orders examples/twogroups/usr/stock \
	examples/twogroups/usrrc \
	examples/uap-c/sysconf examples/uap-c/uap_echo.c examples/uap-c/usr/cecho \
	examples/uap-go/defs/aplib/.gitignore examples/uap-go/defs/sysconf examples/uap-go/defs/usr/greet \
	examples/uap-go/go.mod examples/uap-go/go.sum examples/uap-go/main.go \
	examples/policy/sysconf examples/policy/svcpolicy examples/policy/usr/orders examples/policy/usr/reports
# The race detector slows shared-memory spinning; the tests bound their own time.
TEST_TIMEOUT ?= 30m
# make check's fuzzing time per target (make fuzz's own default is FUZZTIME).
CHECK_FUZZTIME ?= 10s
# The node's module and the benchmark's (bench/go.mod: its peers and plots
# are not the node's dependencies); test, check, test-short and lint cover both.
MODULES := . bench
ABSBIN   = $(abspath $(BIN))

.PHONY: help build uap-c install uninstall test check check-purev2 check-cgroup2 test-short slowest bench bench-bin bench-quick bench-deps demo policy-demo cluster-demo screenshots generate check-generate bpf-tools lint fuzz chaos torture clean

help: ## list the targets
	@awk -F':.*## ' '/^[a-zA-Z0-9_-]+:.*## /{printf "  %-14s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

build: ## build scdd, scdctl and uap-echo into bin/, and with a C compiler the C UAP library and uap-echo-c (make uap-c)
	$(GO) build $(GOFLAGS) -ldflags '$(LDFLAGS)' -o $(BIN)/ ./cmd/...
	@if command -v $(CC) >/dev/null 2>&1; then \
		$(MAKE) --no-print-directory uap-c; \
	else \
		echo "build: no C compiler ($(CC)): the C UAP library is not built (make uap-c needs one)"; \
	fi

# The C UAP library (uap-c/, docs/SHM.md): C11 and libc only.
ifeq ($(origin CC),default)
CC := gcc
endif
AR         ?= ar
UAP_CFLAGS ?= -O2 -Wall -Wextra -Werror -std=c11

uap-c: $(BIN)/libtpsched_uap.a $(BIN)/uap-echo-c ## build the C UAP library bin/libtpsched_uap.a (header uap-c/tpsched_uap.h) and the example C UAP bin/uap-echo-c

$(BIN)/tpsched_uap.o: uap-c/tpsched_uap.c uap-c/tpsched_uap.h
	@mkdir -p $(BIN)
	$(CC) $(UAP_CFLAGS) -c -o $@ uap-c/tpsched_uap.c

$(BIN)/libtpsched_uap.a: $(BIN)/tpsched_uap.o
	rm -f $@
	$(AR) rcs $@ $<

$(BIN)/uap-echo-c: examples/uap-c/uap_echo.c uap-c/tpsched_uap.h $(BIN)/libtpsched_uap.a
	$(CC) $(UAP_CFLAGS) -DUAP_VERSION='"$(VERSION)"' -Iuap-c -o $@ examples/uap-c/uap_echo.c $(BIN)/libtpsched_uap.a

# S10's C caller UAP (the bench's, not installed): built by make bench when
# there is a C compiler.
$(BIN)/uap-caller-c: bench/cmd/uap-caller-c/uap_caller.c uap-c/tpsched_uap.h $(BIN)/libtpsched_uap.a
	$(CC) $(UAP_CFLAGS) -Iuap-c -o $@ bench/cmd/uap-caller-c/uap_caller.c $(BIN)/libtpsched_uap.a

install: build ## install the binaries, the C UAP library (header, static library, pkg-config), the systemd unit, the docs, the Grafana dashboard, the examples and (if absent) /etc/tpsched; PREFIX=/usr/local, DESTDIR
	install -d $(DESTDIR)$(BINDIR) $(DESTDIR)$(UNITDIR) $(DESTDIR)$(DOCDIR)
	install -m 0755 $(BIN)/scdd $(BIN)/scdctl $(BIN)/uap-echo $(DESTDIR)$(BINDIR)/
	@if [ -f $(BIN)/libtpsched_uap.a ] && [ -f $(BIN)/uap-echo-c ]; then \
		set -e; \
		echo "install: the C UAP library into $(DESTDIR)$(INCLUDEDIR), $(DESTDIR)$(LIBDIR), $(DESTDIR)$(PKGCONFIGDIR)"; \
		install -d $(DESTDIR)$(INCLUDEDIR) $(DESTDIR)$(LIBDIR) $(DESTDIR)$(PKGCONFIGDIR); \
		install -m 0755 $(BIN)/uap-echo-c $(DESTDIR)$(BINDIR)/; \
		install -m 0644 uap-c/tpsched_uap.h $(DESTDIR)$(INCLUDEDIR)/; \
		install -m 0644 $(BIN)/libtpsched_uap.a $(DESTDIR)$(LIBDIR)/; \
		printf '%s\n' 'includedir=$${pcfiledir}/$(PC_INCLUDEDIR)' 'libdir=$${pcfiledir}/$(PC_LIBDIR)' '' \
			'Name: tpsched_uap' \
			'Description: tpsched C UAP library: serve the calls scdd hands over through shared memory (docs/SHM.md)' \
			'Version: $(or $(VERSION),0)' \
			'Cflags: -I$${includedir}' 'Libs: -L$${libdir} -ltpsched_uap' >$(DESTDIR)$(PKGCONFIGDIR)/tpsched_uap.pc; \
		chmod 0644 $(DESTDIR)$(PKGCONFIGDIR)/tpsched_uap.pc; \
	else \
		echo "install: no C UAP library in $(BIN) (no C compiler at make build): tpsched_uap.h, libtpsched_uap.a and uap-echo-c not installed"; \
	fi
	sed -e 's|/usr/local/bin/|$(BINDIR)/|g' -e 's|/usr/local/share/doc/tpsched/|$(DOCDIR)/|g' \
		-e 's|/etc/tpsched|$(SYSCONFDIR)/tpsched|g' dist/tpsched.service >$(DESTDIR)$(UNITDIR)/tpsched.service.tmp
	mv $(DESTDIR)$(UNITDIR)/tpsched.service.tmp $(DESTDIR)$(UNITDIR)/tpsched.service
	chmod 0644 $(DESTDIR)$(UNITDIR)/tpsched.service
	@for f in $(DOCS) $(EXAMPLES); do install -D -m 0644 $$f $(DESTDIR)$(DOCDIR)/$$f || exit 1; done
	@echo "install: the docs, dist/grafana/tpsched.json and the examples in $(DESTDIR)$(DOCDIR)"
	@# The Go examples build against this checkout of tpsched (a module
	@# path no proxy serves): their replace points here, not at ../.. .
	@for m in $(filter %/go.mod,$(EXAMPLES)); do \
		sed -i -e 's|^replace tpsched => \.\./\.\.$$|replace tpsched => $(CURDIR)|' $(DESTDIR)$(DOCDIR)/$$m || exit 1; \
	done
	@# The operator's definitions are never overwritten: the embedded demo
	@# goes to $(SYSCONFDIR)/tpsched only when nothing is there.
	@if [ -e $(DESTDIR)$(SYSCONFDIR)/tpsched ]; then \
		echo "install: $(DESTDIR)$(SYSCONFDIR)/tpsched exists, left as it is"; \
	else \
		install -d $(DESTDIR)$(SYSCONFDIR)/tpsched && cp -R scd/def/default/. $(DESTDIR)$(SYSCONFDIR)/tpsched/ && \
		echo "install: the demo definitions are in $(DESTDIR)$(SYSCONFDIR)/tpsched"; \
	fi

# tpsched_uap.pc names the header's and the library's directories relative
# to its own (${pcfiledir}, which pkg-config and pkgconf both know), not as
# PREFIX's absolute paths: a DESTDIR install, staged for a package or a
# container image, is then usable where it lies, with no
# PKG_CONFIG_SYSROOT_DIR, and stays right when it moves (issue 31 item 3).
PC_INCLUDEDIR = $(shell realpath -m --relative-to=$(PKGCONFIGDIR) $(INCLUDEDIR))
PC_LIBDIR     = $(shell realpath -m --relative-to=$(PKGCONFIGDIR) $(LIBDIR))

uninstall: ## remove what make install put in place, except the definitions in /etc/tpsched
	rm -f $(DESTDIR)$(BINDIR)/scdd $(DESTDIR)$(BINDIR)/scdctl $(DESTDIR)$(BINDIR)/uap-echo $(DESTDIR)$(BINDIR)/uap-echo-c \
		$(DESTDIR)$(INCLUDEDIR)/tpsched_uap.h $(DESTDIR)$(LIBDIR)/libtpsched_uap.a $(DESTDIR)$(PKGCONFIGDIR)/tpsched_uap.pc \
		$(DESTDIR)$(UNITDIR)/tpsched.service
	rm -rf $(DESTDIR)$(DOCDIR)

# The tests, three ways (tools/gotest.sh; docs/TESTING.md, "Testing"). Each runs
# both modules even when the first fails, records go test -json under
# .testtimes/ and ends with the slowest tests and each module's result.
test: ## the README's test command, 4-12 minutes on 2 cores: unit tests of both modules with -race, and itest's fast subset (real scdd and UAP processes, built without -race); tests marked testenv.Slow skip
	@TEST_TIMEOUT=$(TEST_TIMEOUT) GO=$(GO) bash tools/gotest.sh test

check: build ## the full suite, what CI runs: every test of both modules with -race (itest's scdd and UAPs built with -race too; TPSCHED_TEST_FULL=1 runs the slow ones), then make fuzz and make chaos; about 30 min
	@st=0; \
	TEST_TIMEOUT=$(TEST_TIMEOUT) GO=$(GO) bash tools/gotest.sh check || st=1; \
	$(MAKE) --no-print-directory check-purev2 || st=1; \
	$(MAKE) --no-print-directory fuzz FUZZTIME=$(CHECK_FUZZTIME) || st=1; \
	$(MAKE) --no-print-directory chaos || st=1; \
	if [ $$st -ne 0 ]; then echo "check: FAILED (see above: go test, pure cgroup v2, fuzz or chaos)"; fi; \
	exit $$st

test-short: ## go test -short of both modules: no race detector, itest not run (nothing builds scdd); unit tests still start helper processes (procmgr, shm, bpf, scd/local re-run the test binary as a UAP)
	@TEST_TIMEOUT=$(TEST_TIMEOUT) GO=$(GO) bash tools/gotest.sh short

slowest: ## the slowest tests of the last make test, check and test-short runs (.testtimes/)
	@$(GO) run ./tools/testtimes -n 25 .testtimes/*.json

check-purev2: ## procmgr's tests on cgroup v2 alone (every controller there): Debian's kernel booted with cgroup_no_v1=all under qemu, no KVM needed (tools/purev2.sh; about 30 s; needs qemu-system-x86 and cpio, skips without them unless CI=true)
	GO=$(GO) sh tools/purev2.sh

check-cgroup2: ## root: move cpu and pids (memory too when its v1 hierarchy is empty) to cgroup v2, run procmgr's containment and priority tests there, move them back (tools/cgroup2-ci.sh)
	sh tools/cgroup2-ci.sh

bench: bench-bin ## S1-S4: tpsched beside gnet echo, gRPC-go, nginx+PHP-FPM (static, dynamic, ondemand), HAProxy; S5: the CPU guard on and off; S6: three nodes, one 3x slower, random vs OpenTP1 vs P2C; S7: announce propagation at 32, 64 and 128 members and over 32 real nodes, the rules simulated over 1,000; S8: skewed connections, the kernel's hash vs steering; S9: a node restarted under load, hand-off vs stop and start; S10: local calls beside Enduro/X (TPSCHED_ENDUROX=its install prefix; README) and the direct call; report in bench/results/ (about 35 min)
	$(BIN)/tpbench -bin $(BIN) -out bench/results $(BENCHFLAGS)

bench-quick: bench-bin ## the bench on a smaller grid, for development, into bench/results/quick/ (its plan, printed at the start, about 8 min of runs, and a minute or two more on a quiet machine; on a busy one up to 10 min more waiting for quiet, -quiet-budget)
	$(BIN)/tpbench -quick -bin $(BIN) -out bench/results/quick $(BENCHFLAGS)

# The bench's own programs beside make build's: tpbench, the Go caller UAP
# and, when make build made the C UAP library, the C caller UAP.
bench-bin: build
	cd bench && $(GO) build $(GOFLAGS) -o $(ABSBIN)/ ./cmd/tpbench ./cmd/uap-caller
	@if [ -f $(BIN)/libtpsched_uap.a ]; then $(MAKE) --no-print-directory $(BIN)/uap-caller-c; fi

bench-deps: ## apt-get install the bench peers: nginx, php-fpm, haproxy (root; the harness runs its own copies, never the system services)
	@command -v apt-get >/dev/null || { echo "bench-deps: needs apt-get (Debian/Ubuntu)"; exit 1; }
	apt-get update
	DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx php-fpm haproxy

demo: build ## start a node on the embedded default, show the warnings it gave at start, call demo/echo, show status, stop it
	@bash tools/demo.sh $(BIN)

policy-demo: build ## the service policy example of docs/CLUSTER.md (examples/policy) on one node: find starts the orders environment, 45 calls, scdctl report after the first interval (about 20 s)
	@bash tools/policy-demo.sh $(BIN)

cluster-demo: build ## three nodes on 127.0.0.2-4: overload one to LEVEL2, show calls going to the others, stop them; fails if its output contradicts a caption
	@bash tools/cluster.sh $(BIN)

screenshots: build ## docs/img/dashboard.png and status-page.png from one real run: three nodes, Debian's prometheus and chromium (about 2.5 min)
	bash tools/screenshots.sh $(BIN)

# The eBPF objects are built with this clang, from Debian bookworm's
# packages, so that `make check-generate` can compare byte for byte.
BPF_CLANG_PKGS := clang-16 llvm-16 libbpf-dev

bpf-tools: ## apt-get install the pinned clang-16, llvm-strip-16 and libbpf headers that bpf2go needs (root)
	@if command -v clang-16 >/dev/null && command -v llvm-strip-16 >/dev/null && test -f /usr/include/bpf/bpf_helpers.h; then \
		echo "bpf-tools: $$(clang-16 --version | head -1)"; \
	else \
		command -v apt-get >/dev/null || { echo "bpf-tools: needs apt-get (Debian/Ubuntu) for $(BPF_CLANG_PKGS)"; exit 1; }; \
		apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $(BPF_CLANG_PKGS); \
	fi

generate: bpf-tools ## regenerate bpf/{sched,steer}_bpfel.{go,o} from bpf/sched.c and bpf/steer.c with bpf2go, and docs/OPERANDS.md (the results are committed)
	$(GO) generate ./...

check-generate: generate ## fail if regenerating changes the committed eBPF files
	@test -z "$$(git status --porcelain -- bpf/)" || { git status --short -- bpf/; echo "check-generate: bpf/ differs from what is committed: run make generate and commit"; exit 1; }

lint: ## gofmt and go vet, both modules; no tracked ELF file but the eBPF objects bpf/*.o
	@bash tools/tracked-elf.sh
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	@for m in $(MODULES); do (cd $$m && $(GO) vet ./...) || exit 1; done

FUZZTIME ?= 30s

chaos: build ## the fault experiments at full length on real processes, one package at a time; prints the table of docs/RELIABILITY.md (about 4 min, root for all of them)
	GO=$(GO) bash tools/chaos.sh

# make torture: issue 27's randomized torture of one node (itest
# TestTorture) for DURATION, then of a cluster of three nodes
# (TestTortureCluster: the serving nodes' scdd killed, stopped and
# restarted too) for CLUSTER_DURATION, each alone and verbose; both run
# even if the first fails. SEED empty: a random seed, printed; ATTACKS
# empty: every class (callers,uapkill,uapstop,uapexit,badexit,localcalls,
# fdpressure,restart; the one node's also sockclose,lanes,clanes; the
# cluster's also peerkill,peerstop,peerrestart,peercut,peerloss,envs).
DURATION         ?= 10m
CLUSTER_DURATION ?= 5m
SEED             ?=
ATTACKS          ?=
torture: ## the torture tests (itest TestTorture for DURATION, default 10m; TestTortureCluster for CLUSTER_DURATION, default 5m) with SEED (default random, printed) and ATTACKS (default all), under the race detector
	@st=0; \
	TPSCHED_TORTURE_DURATION=$(DURATION) TPSCHED_TORTURE_SEED=$(SEED) TPSCHED_TORTURE_ATTACKS=$(ATTACKS) \
		$(GO) test -race -count=1 -v -timeout $(TEST_TIMEOUT) -run '^TestTorture$$' ./itest/ || st=1; \
	TPSCHED_TEST_FULL=1 TPSCHED_TORTURE_DURATION=$(CLUSTER_DURATION) TPSCHED_TORTURE_SEED=$(SEED) TPSCHED_TORTURE_ATTACKS=$(ATTACKS) \
		$(GO) test -race -count=1 -v -timeout $(TEST_TIMEOUT) -run '^TestTortureCluster$$' ./itest/ || st=1; \
	exit $$st

fuzz: ## run every fuzz target in the module (found, not listed) for FUZZTIME each (default 30s)
	GO=$(GO) FUZZTIME=$(FUZZTIME) bash tools/fuzz.sh

clean: ## remove bin/
	rm -rf $(BIN)
