/*
 * tpsched_uap.c: the UAP side of tpsched's shared-memory protocol (docs/SHM.md,
 * layout version 5) and of its socket mode (shm/internal/sockwire), in C11
 * with libc only. The rules it keeps are the spec's, in the order the spec
 * gives them: attach, start serving, take a call, wait, serve, complete,
 * leave; the lanes' rules (a call on one, serving one) come before the
 * wait, which serves them. The Go package tpsched/shm is the reference
 * implementation.
 */
#define _GNU_SOURCE /* syscall(), MAP_SHARED details, MSG_NOSIGNAL */

#include "tpsched_uap.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

_Static_assert(sizeof(struct tpsched_group_page) <= TPSCHED_PAGE_SIZE, "group page fits its page");
_Static_assert(sizeof(struct tpsched_mailbox) == 0x40, "a mailbox is one cache line");
_Static_assert(sizeof(struct tpsched_proc_ctl) <= TPSCHED_PAGE_SIZE, "page 0 fits its page");
_Static_assert(TPSCHED_MAX_ENTRIES * TPSCHED_MAX_NAME == TPSCHED_PAGE_SIZE, "the entry table is page 1");
_Static_assert(sizeof(_Atomic uint64_t) == 8 && _Alignof(_Atomic uint64_t) == 8, "8-byte atomics");

/* futex(2) operations, without FUTEX_PRIVATE_FLAG: the word is in a
 * MAP_SHARED memfd mapping and waited on and woken from two processes. */
#define FUTEX_WAIT_OP 0
#define FUTEX_WAKE_OP 1

/* Every sleep is bounded (100 ms), so that a flag is seen even if a wake-up
 * is lost. A test builds the library with a longer bound, so that a lost
 * wake-up shows as a stall. */
#ifndef TPSCHED_MAX_SLEEP_NS
#define TPSCHED_MAX_SLEEP_NS 100000000LL
#endif

/* Socket mode (shm/internal/sockwire): a 24-byte header, then the entry
 * name (request only), then the payload. */
enum {
	SW_HEADER = 24,
	SW_VERSION = 2,
	SW_HELLO = 1,
	SW_WELCOME = 2,
	SW_REQUEST = 3,
	SW_REPLY = 4,
	SW_STOP = 5,
	SW_CLOSE = 6,
	SW_BYE = 7,
	SW_HELLO_REFRESH = 1,
	STATUS_END = 4
};

/* An adaptive spin budget, as shm's spinner: it doubles when spinning
 * found work and halves when work came only after a sleep, between max/16
 * and max (0 never spins). A spin that finds itself preempted (a gap
 * between two looks at the clock that only a preemption makes) stops, and
 * the spinner does not spin for SPIN_QUIET_NS: the CPUs are
 * oversubscribed, and a spin there takes the CPU the woken side needs. */
struct spinner {
	int64_t budget, max, quiet;
};
#define PREEMPTED_GAP_NS 50000LL
#define SPIN_QUIET_NS 20000000LL

/* Lanes (docs/SHM.md, "Lanes"): the roles of a grant, its message on the
 * control line, and the claim word's states (a ruling's code 0, LANE_MOVED,
 * gives the call back unrun). */
enum { ROLE_CALLEE = 1, ROLE_CALLER = 2 };
#define LANE_MSG_MAGIC UINT32_C(0x4C4E4154) /* "TANL" */
#define LANE_MSG_SIZE (9 * 4 + 3 * TPSCHED_MAX_NAME)
enum { LANE_TAKEN = 1, LANE_DONE = 2, LANE_RULED = 3, LANE_MOVED = 0 };

/* A caller woken more than LANE_IDLE_WAKES times in one call for nothing
 * lets the lane go after it (a callee that floods its caller); one whose
 * call is not ended LANE_LATE_NS past the deadline it wrote ends it itself,
 * 'timed out' (scdd's ruling follows the claim word, which the callee can
 * forge). */
#define LANE_IDLE_WAKES 64
#define LANE_LATE_NS 1000000000LL

/* The frame protocol's codes that a call on a lane answers by itself,
 * without the node (the Go library's, shm/lane_uap.go). */
enum { CODE_NO_SUCH_SERVICE = 2, CODE_TIMED_OUT = 5, CODE_PROTOCOL = 9, CODE_APPLICATION = 10 };

/* tpsched_serve_one's mailbox number for a call on the lane it serves. */
#define LANE_MAILBOX UINT_MAX

struct lane_grant {
	uint32_t gen, role, watch_ms, max_msg;
	char group[TPSCHED_MAX_NAME + 1], service[TPSCHED_MAX_NAME + 1], entry[TPSCHED_MAX_NAME + 1];
	size_t entry_len;
};

/* A process's mapping of one lane; h is NULL when it has none. */
struct lane_end {
	struct lane_grant grant;
	struct tpsched_lane *h;
	size_t len;
	unsigned char *buf;
	struct spinner spin;
};

struct entry {
	char name[TPSCHED_MAX_NAME + 1];
	size_t len;
	tpsched_handler h;
	void *arg;
};

struct tpsched_uap {
	/* Shared-memory mode. */
	unsigned char *area;
	size_t area_len;
	struct tpsched_proc_ctl *ctl;
	const unsigned char *page;
	size_t page_len;
	const struct tpsched_group_page *gp;
	unsigned char *bufs[TPSCHED_MAX_MAILBOXES];
	unsigned mailboxes;
	int bell;
	uint64_t last_no; /* the number of the last call taken or skipped */
	unsigned char *out_buf; /* tpsched_call_service's names, request and answer */
	uint64_t out_no;        /* the number of the last call made */
	int64_t cur_deadline;   /* of the call being served, which a call made inherits */
	int64_t spin_max;       /* TPSCHED_SPIN_US, in ns */
	struct spinner spin;    /* waiting for calls in the mailboxes */

	/* Lanes: the control line (-1: none), the latest grant read from it
	 * and not yet mapped, per role, the lane the process serves and the
	 * one it calls on, the generation of each it last tried to map (one
	 * try per grant), and the number of the call made on lane_out. */
	int line;
	struct {
		struct lane_grant m;
		int fd; /* -1: none */
	} got[ROLE_CALLER + 1];
	struct lane_end lane_in, lane_out;
	uint32_t lane_in_tried, lane_out_tried;
	uint64_t lane_out_no;

	/* Socket mode: socket_mode, and sock >= 0 until the UAP left. */
	bool socket_mode;
	int sock;
	unsigned char *sock_buf;

	size_t max_msg;
	bool refresh, served, started;
	struct entry entries[TPSCHED_MAX_ENTRIES];
	size_t n_entries;
	char entry[TPSCHED_MAX_NAME + 1];
	char err[256];
};

#if defined(__GNUC__)
static void set_err(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
#endif

static void set_err(char *err, size_t errlen, const char *fmt, ...)
{
	if (err == NULL || errlen == 0)
		return;
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

static int64_t clock_ns(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void ring(int bell)
{
	uint64_t one = 1;
	ssize_t r;
	do {
		r = write(bell, &one, sizeof one);
	} while (r < 0 && errno == EINTR);
}

/* env_int parses a non-negative decimal environment variable; def if unset. */
static int env_int(const char *name, int def, int max, int *out)
{
	const char *v = getenv(name);
	if (v == NULL || *v == '\0') {
		*out = def;
		return 0;
	}
	char *end;
	errno = 0;
	long n = strtol(v, &end, 10);
	if (errno != 0 || *end != '\0' || n < 0 || n > max)
		return -1;
	*out = (int)n;
	return 0;
}

static tpsched_uap *new_uap(void)
{
	tpsched_uap *u = calloc(1, sizeof *u);
	if (u == NULL)
		return NULL;
	u->bell = -1;
	u->sock = -1;
	u->line = -1;
	for (int r = 0; r <= ROLE_CALLER; r++)
		u->got[r].fd = -1;
	/* The adaptive spin of shm/futex.go: TPSCHED_SPIN_US bounds it
	 * (default 10 us, 0 never spins, at most 1000). */
	int us;
	if (env_int("TPSCHED_SPIN_US", 10, INT_MAX, &us) != 0)
		us = 10;
	if (us > 1000)
		us = 1000;
	u->spin_max = (int64_t)us * 1000;
	u->spin = (struct spinner){.budget = u->spin_max / 4, .max = u->spin_max};
	return u;
}

static tpsched_uap *attach_socket(int fd, bool refresh, char *err, size_t errlen);
static void open_line(tpsched_uap *u, int fd);

tpsched_uap *tpsched_attach(char *err, size_t errlen)
{
	int base;
	if (env_int("TPSCHED_SHM_FD", 3, INT_MAX - 2, &base) != 0) {
		set_err(err, errlen, "tpsched: TPSCHED_SHM_FD=\"%s\": not a file descriptor", getenv("TPSCHED_SHM_FD"));
		return NULL;
	}
	const char *r = getenv("TPSCHED_REFRESH");
	bool refresh = r != NULL && strcmp(r, "1") == 0;
	const char *recv = getenv("TPSCHED_RECEIVE");
	if (recv != NULL && strcmp(recv, "socket") == 0)
		return attach_socket(base, refresh, err, errlen);
	if (recv != NULL && *recv != '\0' && strcmp(recv, "queue") != 0) {
		set_err(err, errlen, "tpsched: TPSCHED_RECEIVE=\"%s\": want queue or socket", recv);
		return NULL;
	}
	tpsched_uap *u = tpsched_attach_fds(base, base + 1, base + 2, err, errlen);
	if (u != NULL) {
		u->refresh = refresh;
		open_line(u, base + 3);
	}
	return u;
}

/* map_fd maps the whole of a regular file (a memfd). */
static void *map_fd(int fd, int prot, size_t *len, char *why, size_t whylen)
{
	struct stat st;
	if (fstat(fd, &st) != 0) {
		snprintf(why, whylen, "fstat: %s", strerror(errno));
		return NULL;
	}
	if (!S_ISREG(st.st_mode) || st.st_size < TPSCHED_PAGE_SIZE) {
		snprintf(why, whylen, "not a shared memory file");
		return NULL;
	}
	void *m = mmap(NULL, (size_t)st.st_size, prot, MAP_SHARED, fd, 0);
	if (m == MAP_FAILED) {
		snprintf(why, whylen, "mmap: %s", strerror(errno));
		return NULL;
	}
	*len = (size_t)st.st_size;
	return m;
}

tpsched_uap *tpsched_attach_fds(int area, int group, int bell, char *err, size_t errlen)
{
#define NOT_OURS_FMT "tpsched: attach: fd %d is not a tpsched %s (a UAP must be started by scdd, which passes its area, the group page and its doorbell as fds %d, %d and %d)"
	char why[128];
	size_t alen, glen;
	unsigned char *amem = map_fd(area, PROT_READ | PROT_WRITE, &alen, why, sizeof why);
	if (amem == NULL) {
		set_err(err, errlen, NOT_OURS_FMT ": %s", area, "process area", area, area + 1, area + 2, why);
		return NULL;
	}
	unsigned char *gmem = map_fd(group, PROT_READ, &glen, why, sizeof why);
	if (gmem == NULL) {
		munmap(amem, alen);
		set_err(err, errlen, NOT_OURS_FMT ": %s", group, "group page", area, area + 1, area + 2, why);
		return NULL;
	}
	struct tpsched_proc_ctl *ctl = (struct tpsched_proc_ctl *)amem;
	const struct tpsched_group_page *gp = (const struct tpsched_group_page *)gmem;
	struct stat st;
	if (ctl->magic != TPSCHED_PROC_MAGIC) {
		set_err(err, errlen, NOT_OURS_FMT, area, "process area", area, area + 1, area + 2);
	} else if (gp->magic != TPSCHED_GROUP_MAGIC) {
		set_err(err, errlen, NOT_OURS_FMT, group, "group page", area, area + 1, area + 2);
	} else if (ctl->version != TPSCHED_LAYOUT_VERSION || gp->version != TPSCHED_LAYOUT_VERSION) {
		set_err(err, errlen, "tpsched: attach: layout version %u, this library knows %d (rebuild it from the node's uap-c/)",
			ctl->version, TPSCHED_LAYOUT_VERSION);
	} else if (ctl->max_message < 1 || ctl->max_message > TPSCHED_MAX_MESSAGE || ctl->max_message != gp->max_message ||
		   ctl->mailboxes < 1 || ctl->mailboxes > TPSCHED_MAX_MAILBOXES ||
		   alen != TPSCHED_AREA_SIZE(ctl->max_message, ctl->mailboxes)) {
		set_err(err, errlen, "tpsched: attach: area of %zu bytes does not fit max_message_size %u and %u mailboxes", alen,
			ctl->max_message, ctl->mailboxes);
	} else if (atomic_load(&ctl->state) != TPSCHED_STATE_NEW) {
		set_err(err, errlen, "tpsched: attach: the process area is in use by pid %u", atomic_load(&ctl->pid));
	} else if (fstat(bell, &st) != 0) {
		set_err(err, errlen, NOT_OURS_FMT ": fstat: %s", bell, "doorbell", area, area + 1, area + 2, strerror(errno));
	} else {
		tpsched_uap *u = new_uap();
		if (u == NULL) {
			set_err(err, errlen, "tpsched: attach: %s", strerror(errno));
		} else {
			/* Another process of the same user could otherwise open this
			 * one's area through /proc/PID/fd and answer its calls. */
			prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
			u->area = amem;
			u->area_len = alen;
			u->ctl = ctl;
			u->page = gmem;
			u->page_len = glen;
			u->gp = gp;
			u->bell = bell;
			u->max_msg = ctl->max_message;
			u->mailboxes = ctl->mailboxes; /* read once: scdd's count, not what may be written later */
			for (unsigned i = 0; i < u->mailboxes; i++)
				u->bufs[i] = amem + TPSCHED_BUFFERS + i * TPSCHED_BUF_STRIDE(ctl->max_message);
			u->out_buf = amem + TPSCHED_BUFFERS + u->mailboxes * TPSCHED_BUF_STRIDE(ctl->max_message);
			close(area); /* mapped: the descriptors are no longer needed */
			close(group);
			atomic_store(&ctl->pid, (uint32_t)getpid());
			return u;
		}
	}
	munmap(amem, alen);
	munmap(gmem, glen);
	return NULL;
#undef NOT_OURS_FMT
}

int tpsched_handle(tpsched_uap *u, const char *entry, tpsched_handler h, void *arg)
{
	if (entry == NULL || *entry == '\0' || h == NULL) {
		errno = EINVAL;
		return -1;
	}
	size_t len = strlen(entry);
	if (len > TPSCHED_MAX_NAME) {
		errno = ENAMETOOLONG;
		return -1;
	}
	if (u->started) {
		errno = EBUSY;
		return -1;
	}
	for (size_t i = 0; i < u->n_entries; i++) {
		if (u->entries[i].len == len && memcmp(u->entries[i].name, entry, len) == 0) {
			u->entries[i].h = h;
			u->entries[i].arg = arg;
			return 0;
		}
	}
	if (u->n_entries == TPSCHED_MAX_ENTRIES) {
		errno = ENOSPC;
		return -1;
	}
	struct entry *e = &u->entries[u->n_entries++];
	memcpy(e->name, entry, len + 1);
	e->len = len;
	e->h = h;
	e->arg = arg;
	return 0;
}

size_t tpsched_max_message(const tpsched_uap *u) { return u->max_msg; }

const char *tpsched_error(const tpsched_uap *u) { return u->err; }

const char *tpsched_status_name(int status)
{
	switch (status) {
	case TPSCHED_OK:
		return "ok";
	case TPSCHED_APP_ERROR:
		return "application error";
	case TPSCHED_NO_SUCH_SERVICE:
		return "no such service";
	case TPSCHED_TIMED_OUT:
		return "timed out";
	}
	return "unknown status";
}

int tpsched_app_error(tpsched_call *call, const char *fmt, ...)
{
	char msg[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	if (n < 0)
		n = 0;
	size_t len = (size_t)n < sizeof msg ? (size_t)n : sizeof msg - 1;
	if (len > call->cap)
		len = call->cap;
	memcpy(call->buf, msg, len);
	call->len = len;
	return TPSCHED_APP_ERROR;
}

/* reply_msg writes a message of the library's into buf as the reply. */
static uint32_t reply_msg(unsigned char *buf, size_t cap, const char *msg)
{
	size_t n = strlen(msg);
	if (n > cap)
		n = cap;
	memcpy(buf, msg, n);
	return (uint32_t)n;
}

/* run serves one call whose request is buf[0:n]: the spec's "Serve". The
 * entry name is in u->entry, entry_len bytes. */
static int run(tpsched_uap *u, unsigned char *buf, size_t n, int64_t deadline, size_t entry_len, uint32_t *reply_len)
{
	if (deadline != 0 && clock_ns(CLOCK_REALTIME) > deadline) {
		*reply_len = 0;
		return TPSCHED_TIMED_OUT;
	}
	struct entry *e = NULL;
	for (size_t i = 0; i < u->n_entries; i++) {
		if (u->entries[i].len == entry_len && memcmp(u->entries[i].name, u->entry, entry_len) == 0) {
			e = &u->entries[i];
			break;
		}
	}
	if (e == NULL) {
		size_t rl = entry_len < u->max_msg ? entry_len : u->max_msg;
		memcpy(buf, u->entry, rl);
		*reply_len = (uint32_t)rl;
		return TPSCHED_NO_SUCH_SERVICE;
	}
	tpsched_call call = {
		.entry = u->entry, .buf = buf, .len = n, .cap = u->max_msg, .deadline = deadline, .arg = e->arg, .uap = u,
	};
	u->cur_deadline = deadline;
	int st = e->h(&call);
	u->cur_deadline = 0;
	if (st != TPSCHED_OK && st != TPSCHED_APP_ERROR) {
		char msg[64];
		snprintf(msg, sizeof msg, "handler returned status %d", st);
		*reply_len = reply_msg(buf, u->max_msg, msg);
		return TPSCHED_APP_ERROR;
	}
	if (call.len > u->max_msg) {
		*reply_len = reply_msg(buf, u->max_msg, "reply too big");
		return TPSCHED_APP_ERROR;
	}
	if (call.buf != buf && call.len > 0)
		memmove(buf, call.buf, call.len); /* a reply of the handler's own, maybe inside buf */
	*reply_len = (uint32_t)call.len;
	return st;
}

/* publish registers the entries in page 1 and says the process is ready:
 * the spec's "Start serving". */
static void publish(tpsched_uap *u)
{
	unsigned char *table = u->area + TPSCHED_ENTRY_TABLE;
	for (size_t i = 0; i < u->n_entries; i++) {
		unsigned char *slot = table + i * TPSCHED_MAX_NAME;
		memset(slot, 0, TPSCHED_MAX_NAME);
		memcpy(slot, u->entries[i].name, u->entries[i].len);
	}
	atomic_store(&u->ctl->entries, (uint32_t)u->n_entries);
	if (u->line >= 0 && !u->refresh)
		atomic_store(&u->ctl->lanes, 1);
	atomic_store(&u->ctl->state, (uint32_t)TPSCHED_STATE_READY);
	u->started = true;
	ring(u->bell); /* the node hands calls only to a ready process */
}

static void leave(tpsched_uap *u)
{
	if (atomic_load(&u->ctl->state) != TPSCHED_STATE_LEFT) {
		atomic_store(&u->ctl->state, (uint32_t)TPSCHED_STATE_LEFT);
		ring(u->bell);
	}
}

static bool new_call(const tpsched_uap *u) { return atomic_load(&u->ctl->dispatch_no) > u->last_no; }

static bool told(const tpsched_uap *u)
{
	return atomic_load(&u->ctl->stop) != 0 || atomic_load(&u->gp->closed) != 0;
}

/* take claims the next call handed over, in number order, finding each by
 * its mailbox's claim word and skipping those the node revoked: the spec's
 * "Take a call". 0 if none; else the call's number, its mailbox in *mb. */
static uint64_t take(tpsched_uap *u, unsigned *mb)
{
	uint64_t d = atomic_load(&u->ctl->dispatch_no);
	while (u->last_no < d) {
		uint64_t n = ++u->last_no;
		for (unsigned i = 0; i < u->mailboxes; i++) {
			_Atomic uint64_t *c = &u->ctl->mailbox[i].claim;
			uint64_t v = atomic_load(c);
			if (v >> 2 != n)
				continue;
			uint64_t offered = n << 2 | TPSCHED_CLAIM_OFFERED;
			if ((v & 3) == TPSCHED_CLAIM_OFFERED &&
			    atomic_compare_exchange_strong(c, &offered, n << 2 | TPSCHED_CLAIM_TAKEN)) {
				*mb = i;
				return n;
			}
			break; /* revoked */
		}
		/* In no mailbox: revoked, and its mailbox holds a later call. */
	}
	return 0;
}

/* learn records that work came after waited ns (negative: it never came). */
static void learn(struct spinner *sp, int64_t waited)
{
	if (waited >= 0 && waited <= sp->budget) {
		int64_t b = 2 * sp->budget + 250;
		sp->budget = b < sp->max ? b : sp->max;
	} else {
		int64_t b = sp->budget / 2;
		sp->budget = b > sp->max / 16 ? b : sp->max / 16;
	}
}

/* spin polls ready until it is true or the budget, counted from start, is
 * spent; false at once within SPIN_QUIET_NS of a spin that was preempted. */
static bool spin(struct spinner *sp, int64_t start, bool (*ready)(const tpsched_uap *), const tpsched_uap *u)
{
	if (sp->budget <= 0 || start < sp->quiet)
		return false;
	int64_t last = clock_ns(CLOCK_MONOTONIC);
	for (unsigned i = 1;; i++) {
		if (ready(u))
			return true;
		if (i % 16 == 0) {
			int64_t now = clock_ns(CLOCK_MONOTONIC);
			if (now - last > PREEMPTED_GAP_NS) {
				sp->quiet = now + SPIN_QUIET_NS;
				return false;
			}
			if (now - start >= sp->budget)
				return false;
			last = now;
		}
	}
}

/* sleep_on sleeps on the futex word wake, bounded, unless ready(u): it
 * says so in sleeping first and looks at ready once more after that, so a
 * wake-up sent between the caller's last look and the announcement is not
 * lost (scdd wakes only those that announced). */
static void sleep_on(_Atomic uint32_t *wake, _Atomic uint32_t *sleeping, bool (*ready)(const tpsched_uap *),
		     const tpsched_uap *u)
{
	uint32_t w = atomic_load(wake);
	atomic_store(sleeping, 1);
	if (!ready(u)) {
		struct timespec ts = {.tv_sec = TPSCHED_MAX_SLEEP_NS / 1000000000LL,
				      .tv_nsec = TPSCHED_MAX_SLEEP_NS % 1000000000LL};
		syscall(SYS_futex, (void *)wake, FUTEX_WAIT_OP, w, &ts, NULL, 0);
	}
	atomic_store(sleeping, 0);
}

/* out_answered: the node answered the last call the process made. */
static bool out_answered(const tpsched_uap *u) { return atomic_load(&u->ctl->out.done) >= u->out_no; }

/* ---- lanes (docs/SHM.md, "Lanes"; the Go library's shm/lane_uap.go) ---- */

static uint64_t le(const unsigned char *p, int n);

static void futex_wake(_Atomic uint32_t *word)
{
	syscall(SYS_futex, (void *)word, FUTEX_WAKE_OP, 1, NULL, NULL, 0);
}

/* wake moves the other side's futex word and wakes it if it said it sleeps. */
static void wake(_Atomic uint32_t *word, _Atomic uint32_t *sleeping)
{
	atomic_fetch_add(word, 1);
	if (atomic_load(sleeping) != 0 && atomic_exchange(sleeping, 0) != 0)
		futex_wake(word);
}

static bool lane_final(uint64_t claim) { return (claim & 3) >= LANE_DONE; }

/* open_line takes fd as the process's control line if it is one (a
 * SOCK_SEQPACKET socket); otherwise the process takes no lanes. */
static void open_line(tpsched_uap *u, int fd)
{
	int type;
	socklen_t len = sizeof type;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0 || type != SOCK_SEQPACKET)
		return;
	fcntl(fd, F_SETFD, FD_CLOEXEC); /* the UAP's own children get none of its lanes */
	u->line = fd;
}

static bool decode_grant(const unsigned char *b, size_t n, struct lane_grant *m)
{
	if (n != LANE_MSG_SIZE || le(b, 4) != LANE_MSG_MAGIC || le(b + 4, 4) != TPSCHED_LAYOUT_VERSION)
		return false;
	m->gen = (uint32_t)le(b + 8, 4);
	m->role = (uint32_t)le(b + 12, 4);
	m->watch_ms = (uint32_t)le(b + 16, 4);
	m->max_msg = (uint32_t)le(b + 20, 4);
	uint64_t gl = le(b + 24, 4), sl = le(b + 28, 4), el = le(b + 32, 4);
	if (gl > TPSCHED_MAX_NAME || sl > TPSCHED_MAX_NAME || el > TPSCHED_MAX_NAME || m->gen == 0 ||
	    (m->role != ROLE_CALLEE && m->role != ROLE_CALLER))
		return false;
	memcpy(m->group, b + 36, gl);
	m->group[gl] = '\0';
	memcpy(m->service, b + 36 + TPSCHED_MAX_NAME, sl);
	m->service[sl] = '\0';
	memcpy(m->entry, b + 36 + 2 * TPSCHED_MAX_NAME, el);
	m->entry[el] = '\0';
	m->entry_len = el;
	return true;
}

/* line_read takes every message waiting on the control line, keeping the
 * latest grant per role and closing the descriptors of those it replaces or
 * cannot use; at the line's end (or an error) it closes the line. */
static void line_read(tpsched_uap *u)
{
	while (u->line >= 0) {
		unsigned char buf[LANE_MSG_SIZE + 1];
		union {
			struct cmsghdr h;
			char b[CMSG_SPACE(4 * sizeof(int))];
		} cm;
		struct iovec iov = {.iov_base = buf, .iov_len = sizeof buf};
		struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cm.b, .msg_controllen = sizeof cm.b};
		ssize_t n = recvmsg(u->line, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 || (n == 0 && mh.msg_controllen == 0)) {
			if (n == 0 || errno != EAGAIN) {
				close(u->line); /* ended: no more lanes */
				u->line = -1;
			}
			return;
		}
		int fds[4], nfd = 0;
		for (struct cmsghdr *c = CMSG_FIRSTHDR(&mh); c != NULL; c = CMSG_NXTHDR(&mh, c)) {
			if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS)
				continue;
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
			for (size_t i = 0; i < k; i++) {
				int fd;
				memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
				if (nfd < 4)
					fds[nfd++] = fd;
				else
					close(fd);
			}
		}
		struct lane_grant m;
		if (!decode_grant(buf, (size_t)n, &m) || nfd != 1) {
			for (int i = 0; i < nfd; i++)
				close(fds[i]);
			continue;
		}
		if (u->got[m.role].fd >= 0)
			close(u->got[m.role].fd);
		u->got[m.role].m = m;
		u->got[m.role].fd = fds[0];
	}
}

/* map_granted maps into e the lane of generation gen that the node granted
 * the process in role; false if its grant has not come or cannot be mapped
 * (the node revokes such a grant). */
static bool map_granted(tpsched_uap *u, uint32_t role, uint32_t gen, struct lane_end *e)
{
	line_read(u);
	if (u->got[role].fd < 0 || u->got[role].m.gen != gen)
		return false;
	const struct lane_grant *m = &u->got[role].m;
	int fd = u->got[role].fd;
	u->got[role].fd = -1;
	bool ok = false;
	char why[128];
	size_t len;
	/* A callee serves into the lane's buffer as into a mailbox's, of
	 * max_message bytes: the node's grant is the callee group's. */
	unsigned char *mem = m->max_msg < 1 || m->max_msg > TPSCHED_MAX_MESSAGE ||
					     (role == ROLE_CALLEE && m->max_msg != u->max_msg)
				     ? NULL
				     : map_fd(fd, PROT_READ | PROT_WRITE, &len, why, sizeof why);
	if (mem != NULL) {
		struct tpsched_lane *h = (struct tpsched_lane *)mem;
		if (len == TPSCHED_LANE_SIZE(m->max_msg) && h->magic == TPSCHED_LANE_MAGIC &&
		    h->version == TPSCHED_LAYOUT_VERSION && h->gen == gen && h->max_message == m->max_msg) {
			*e = (struct lane_end){.grant = *m, .h = h, .len = len, .buf = mem + TPSCHED_LANE_BUFFER,
					       .spin = {.budget = u->spin_max / 4, .max = u->spin_max}};
			ok = true;
		} else {
			munmap(mem, len);
		}
	}
	close(fd);
	return ok;
}

static void unmap_lane(struct lane_end *e)
{
	munmap(e->h, e->len);
	e->h = NULL;
	e->buf = NULL;
}

/* leave_lane_in unmaps the lane the process serves and says so: it takes no
 * call on it from here, and the node gives it back to its queue at its next
 * look. Between calls. */
static void leave_lane_in(tpsched_uap *u)
{
	if (u->lane_in.h == NULL)
		return;
	atomic_store(&u->ctl->lane_in_on, 0);
	unmap_lane(&u->lane_in);
	if (atomic_load(&u->gp->reader_sleeping) != 0)
		ring(u->bell);
}

/* drop_lane unmaps the lane the process calls on: revoked, or out of step
 * with it (a call abandoned on it, an answer that breaks it). */
static void drop_lane(tpsched_uap *u)
{
	if (u->lane_out.h == NULL)
		return;
	atomic_store(&u->ctl->lane_out_on, 0);
	unmap_lane(&u->lane_out);
}

/* sync_lane_in brings the lane the process serves in step with its area: it
 * leaves one the node revoked and maps one granted. Between calls. */
static void sync_lane_in(tpsched_uap *u)
{
	uint32_t gen = atomic_load(&u->ctl->lane_in);
	if (u->lane_in.h != NULL) {
		if (u->lane_in.grant.gen == gen)
			return;
		leave_lane_in(u);
	}
	if (gen == 0 || gen == u->lane_in_tried)
		return;
	u->lane_in_tried = gen;
	if (map_granted(u, ROLE_CALLEE, gen, &u->lane_in))
		atomic_store(&u->ctl->lane_in_on, gen);
}

/* sync_lane_out is sync_lane_in for the lane the process calls on. */
static void sync_lane_out(tpsched_uap *u)
{
	uint32_t gen = atomic_load(&u->ctl->lane_out);
	if (u->lane_out.h != NULL) {
		if (u->lane_out.grant.gen == gen)
			return;
		drop_lane(u);
	}
	if (gen == 0 || gen == u->lane_out_tried)
		return;
	u->lane_out_tried = gen;
	if (map_granted(u, ROLE_CALLER, gen, &u->lane_out))
		atomic_store(&u->ctl->lane_out_on, gen);
}

/* lane_pending: the caller made a call on the lane served that the process
 * has not taken. */
static bool lane_pending(const struct lane_end *e)
{
	uint64_t c = atomic_load(&e->h->claim);
	return lane_final(c) && atomic_load(&e->h->seq) != c >> 8;
}

/* take_lane claims the call the caller made on the lane the process serves;
 * 0 when there is none (or the lane was revoked, or the node ruled it). */
static uint64_t take_lane(tpsched_uap *u)
{
	struct lane_end *e = &u->lane_in;
	if (e->h == NULL || atomic_load(&u->ctl->lane_in) != e->grant.gen)
		return 0;
	/* One look at the claim decides: the call after the one it ends,
	 * if the caller made it (a claim read again may be the node's ruling
	 * of that very call, and there is nothing to take after it). */
	uint64_t c = atomic_load(&e->h->claim);
	if (!lane_final(c) || atomic_load(&e->h->seq) == c >> 8)
		return 0;
	uint64_t n = (c >> 8) + 1;
	if (!atomic_compare_exchange_strong(&e->h->claim, &c, n << 8 | LANE_TAKEN))
		return 0; /* ruled meanwhile: given back to the caller */
	return n;
}

/* bounded_deadline is deadline bounded by watch_ms from now (0: none). */
static int64_t bounded_deadline(int64_t deadline, uint32_t watch_ms)
{
	if (watch_ms == 0)
		return deadline;
	int64_t bound = clock_ns(CLOCK_REALTIME) + (int64_t)watch_ms * 1000000;
	return deadline == 0 || deadline > bound ? bound : deadline;
}

/* serve_lane runs call n, which take_lane claimed, and answers it into the
 * lane: the lane is the process's until it stores done. */
static void serve_lane(tpsched_uap *u, uint64_t n)
{
	struct lane_end *e = &u->lane_in;
	struct tpsched_lane *h = e->h;
	size_t len = atomic_load(&h->req_len);
	if (len > e->grant.max_msg)
		len = e->grant.max_msg;
	memcpy(u->entry, e->grant.entry, e->grant.entry_len + 1);
	uint32_t rl;
	int st = run(u, e->buf, len, bounded_deadline(atomic_load(&h->deadline), e->grant.watch_ms), e->grant.entry_len, &rl);
	atomic_store(&h->status, (uint32_t)st);
	atomic_store(&h->reply_len, rl);
	uint64_t taken = n << 8 | LANE_TAKEN;
	if (atomic_compare_exchange_strong(&h->claim, &taken, n << 8 | LANE_DONE))
		wake(&h->caller_wake, &h->caller_sleeping);
}

/* lane_answered: the call made on lane_out is over (done or ruled). */
static bool lane_answered(const tpsched_uap *u)
{
	uint64_t c = atomic_load(&u->lane_out.h->claim);
	return c >> 8 == u->lane_out_no && lane_final(c);
}

/* await_lane waits for the call made on lane_out, spinning and then
 * sleeping on the lane's word for the caller: 0, or -1 past late (unix ns;
 * 0 none). *idle counts the wake-ups that brought no answer. */
static int await_lane(tpsched_uap *u, int64_t late, int *idle)
{
	struct lane_end *e = &u->lane_out;
	int64_t start = clock_ns(CLOCK_MONOTONIC);
	if (spin(&e->spin, start, lane_answered, u)) {
		learn(&e->spin, clock_ns(CLOCK_MONOTONIC) - start);
		return 0;
	}
	learn(&e->spin, -1);
	while (!lane_answered(u)) {
		if (late != 0 && clock_ns(CLOCK_REALTIME) > late)
			return -1;
		uint32_t w = atomic_load(&e->h->caller_wake);
		sleep_on(&e->h->caller_wake, &e->h->caller_sleeping, lane_answered, u);
		if (atomic_load(&e->h->caller_wake) != w && !lane_answered(u))
			(*idle)++;
	}
	return 0;
}

/* answer copies an answer, prefix then b[0:n], into out[0:*out_len] for
 * tpsched_call_service, the node's or a lane's: code, or -1 with EMSGSIZE
 * when it does not fit out_cap (out holds its start). */
static int answer(int code, const char *prefix, const unsigned char *b, size_t n, void *out, size_t out_cap, size_t *out_len)
{
	size_t pl = strlen(prefix), got = 0;
	const struct {
		const void *p;
		size_t n;
	} parts[2] = {{prefix, pl}, {b, n}};
	for (int i = 0; i < 2; i++) {
		size_t k = parts[i].n < out_cap - got ? parts[i].n : out_cap - got;
		if (k > 0) /* out may be NULL with out_cap 0: memcpy's arguments must be valid even for 0 bytes */
			memcpy((unsigned char *)out + got, parts[i].p, k);
		got += k;
	}
	*out_len = got;
	if (got < pl + n) {
		errno = EMSGSIZE;
		return -1;
	}
	return code;
}

/* call_lane makes a call on the lane to group/service, if the process has
 * one for it, and answers it as tpsched_call_service does. *sent is false
 * when it has none, or the call was given back unrun (the lane was revoked
 * before the callee took it): the caller then makes it the usual way. */
static int call_lane(tpsched_uap *u, const char *group, const char *service, const void *req, size_t req_len, int64_t deadline,
		     void *out, size_t out_cap, size_t *out_len, bool *sent)
{
	*sent = false;
	sync_lane_out(u);
	struct lane_end *e = &u->lane_out;
	if (e->h == NULL || strcmp(e->grant.group, group) != 0 || strcmp(e->grant.service, service) != 0 ||
	    req_len > e->grant.max_msg)
		return 0;
	struct tpsched_lane *h = e->h;
	uint64_t c = atomic_load(&h->claim);
	if (!lane_final(c) || atomic_load(&h->seq) != c >> 8) {
		drop_lane(u); /* its last call is not over: abandoned, or the lane broken */
		return 0;
	}
	uint64_t n = (c >> 8) + 1;
	deadline = bounded_deadline(deadline, e->grant.watch_ms);
	if (req_len > 0)
		memcpy(e->buf, req, req_len);
	atomic_store(&h->req_len, (uint32_t)req_len);
	atomic_store(&h->deadline, deadline);
	atomic_store(&h->seq, n); /* publishes the call */
	if (atomic_load(&u->ctl->lane_out) != e->grant.gen) {
		/* Revoked as it was made: take it back unless the callee took
		 * it (or the node gave it back: the claim says which). */
		if (atomic_compare_exchange_strong(&h->claim, &c, n << 8 | LANE_MOVED << 2 | LANE_RULED)) {
			drop_lane(u);
			return 0;
		}
	}
	wake(&h->callee_wake, &h->callee_sleeping);
	*sent = true;
	u->lane_out_no = n;
	int idle = 0;
	if (await_lane(u, deadline != 0 ? deadline + LANE_LATE_NS : 0, &idle) != 0) {
		drop_lane(u);
		return answer(CODE_TIMED_OUT, "timed out: no answer on the lane by its deadline", NULL, 0, out, out_cap, out_len);
	}
	c = atomic_load(&h->claim);
	if ((c & 3) == LANE_RULED) {
		uint32_t code = (uint32_t)(c >> 2) & 0x3F;
		size_t ml = atomic_load(&h->rule_len);
		unsigned char msg[TPSCHED_LANE_RULE_MAX];
		memcpy(msg, h->rule_text, ml < sizeof msg ? ml : sizeof msg);
		/* Over for the caller, maybe not for the callee ('timed out'
		 * while it ran): it may still read the buffer and write its
		 * reply there, so no further call shares the buffer with it. */
		drop_lane(u);
		if (code == LANE_MOVED) {
			*sent = false;
			return 0;
		}
		return answer((int)code, "", msg, ml < sizeof msg ? ml : sizeof msg, out, out_cap, out_len);
	}
	size_t rl = atomic_load(&h->reply_len);
	if (rl > e->grant.max_msg)
		rl = e->grant.max_msg;
	int rc;
	switch (atomic_load(&h->status)) {
	case TPSCHED_OK:
		rc = answer(0, "", e->buf, rl, out, out_cap, out_len);
		break;
	case TPSCHED_APP_ERROR:
		rc = answer(CODE_APPLICATION, "application error: ", e->buf, rl, out, out_cap, out_len);
		break;
	case TPSCHED_NO_SUCH_SERVICE: {
		char msg[96];
		snprintf(msg, sizeof msg, "no such service: entry %.*s is not registered by the UAP", (int)(rl < TPSCHED_MAX_NAME ? rl : TPSCHED_MAX_NAME),
			 (const char *)e->buf);
		rc = answer(CODE_NO_SUCH_SERVICE, msg, NULL, 0, out, out_cap, out_len);
		break;
	}
	case TPSCHED_TIMED_OUT:
		rc = answer(CODE_TIMED_OUT, "timed out: its deadline passed before the UAP process started it", NULL, 0, out, out_cap,
			    out_len);
		break;
	default:
		drop_lane(u);
		return answer(CODE_PROTOCOL, "protocol error: the UAP process answered with an unknown status", NULL, 0, out, out_cap,
			      out_len);
	}
	if (idle > LANE_IDLE_WAKES)
		drop_lane(u); /* woken for nothing again and again: a callee that floods its caller */
	return rc;
}

/* news: a call handed over, a call made on the lane the process serves,
 * or a lane granted or revoked. */
static bool news(const tpsched_uap *u)
{
	uint32_t gen = atomic_load(&u->ctl->lane_in);
	if (u->lane_in.h == NULL)
		return new_call(u) || (gen != 0 && gen != u->lane_in_tried);
	return new_call(u) || lane_pending(&u->lane_in) || gen != u->lane_in.grant.gen;
}

static bool news_or_told(const tpsched_uap *u) { return news(u) || told(u); }

/* next waits for the next call, spinning and then sleeping on the futex
 * word: the spec's "Wait" (and "Serve a lane"). 0 when the process is to
 * leave; a call on the lane the process serves comes back with mailbox
 * LANE_MAILBOX. */
static uint64_t next(tpsched_uap *u, unsigned *mb)
{
	struct tpsched_proc_ctl *c = u->ctl;
	int64_t start = clock_ns(CLOCK_MONOTONIC);
	bool spun = false;
	for (;;) {
		sync_lane_in(u);
		uint64_t n = take_lane(u);
		if (n != 0) {
			learn(&u->lane_in.spin, clock_ns(CLOCK_MONOTONIC) - start);
			*mb = LANE_MAILBOX;
			return n;
		}
		n = take(u, mb);
		if (n != 0) {
			learn(&u->spin, clock_ns(CLOCK_MONOTONIC) - start);
			return n;
		}
		/* A call handed over between take's look and the flag's is
		 * still ours to serve: leave only with none to take. */
		if (told(u)) {
			n = take(u, mb);
			if (n == 0)
				leave_lane_in(u);
			return n;
		}
		struct tpsched_lane *lane = u->lane_in.h;
		if (!spun) {
			spun = true;
			struct spinner *sp = lane != NULL ? &u->lane_in.spin : &u->spin;
			if (spin(sp, start, news, u))
				continue;
			learn(sp, -1);
		}
		/* On a lane, its word: the caller moves it at every call, the
		 * node at a revoke, a stop and its close. */
		if (lane != NULL)
			sleep_on(&lane->callee_wake, &lane->callee_sleeping, news_or_told, u);
		else
			sleep_on(&c->wake, &c->sleeping, news_or_told, u);
	}
}

int tpsched_call_service(tpsched_uap *u, const char *group, const char *service, const void *req, size_t req_len, void *out,
			 size_t out_cap, size_t *out_len, uint32_t timeout_ms)
{
	*out_len = 0;
	if (u->socket_mode) {
		errno = ENOTSUP;
		return -1;
	}
	size_t gl = strlen(group), sl = strlen(service);
	if (gl < 1 || gl >= TPSCHED_MAX_NAME || sl < 1 || sl >= TPSCHED_MAX_NAME || req_len > u->max_msg) {
		errno = EINVAL;
		return -1;
	}
	int64_t deadline = 0;
	if (timeout_ms != 0)
		deadline = clock_ns(CLOCK_REALTIME) + (int64_t)timeout_ms * 1000000;
	else if (u->cur_deadline != 0)
		deadline = u->cur_deadline;
	bool sent;
	int rc = call_lane(u, group, service, req, req_len, deadline, out, out_cap, out_len, &sent);
	if (sent)
		return rc;
	/* What is left of it now: a call given back by its lane waited there. */
	if (deadline != 0) {
		int64_t left = deadline - clock_ns(CLOCK_REALTIME);
		if (left <= 0) {
			errno = ETIMEDOUT;
			return -1;
		}
		left /= 1000000;
		timeout_ms = left < 1 ? 1 : left > INT32_MAX ? INT32_MAX : (uint32_t)left;
	}
	/* The spec's "Call another service". */
	struct tpsched_out_call *c = &u->ctl->out;
	memcpy(u->out_buf, group, gl);
	memcpy(u->out_buf + gl, service, sl);
	if (req_len > 0)
		memcpy(u->out_buf + gl + sl, req, req_len);
	c->timeout_ms = timeout_ms;
	c->group_len = (uint32_t)gl;
	c->service_len = (uint32_t)sl;
	c->req_len = (uint32_t)req_len;
	uint64_t no = ++u->out_no;
	atomic_store(&c->no, no);
	if (atomic_load(&u->gp->reader_sleeping) != 0)
		ring(u->bell);
	while (!out_answered(u))
		sleep_on(&c->wake, &c->sleeping, out_answered, u);
	uint32_t code = atomic_load(&c->code);
	size_t n = atomic_load(&c->reply_len);
	if (n > u->max_msg)
		n = u->max_msg;
	return answer((int)code, "", u->out_buf, n, out, out_cap, out_len);
}

/* serve runs call no, which take claimed, and completes it: the spec's
 * "Serve" and "Complete". The mailbox is the UAP's until done_no says so. */
static void serve(tpsched_uap *u, uint64_t no, unsigned i)
{
	struct tpsched_mailbox *m = &u->ctl->mailbox[i];
	unsigned char *buf = u->bufs[i];
	size_t n = m->req_len < u->max_msg ? m->req_len : u->max_msg;
	size_t nl = m->entry_len < TPSCHED_MAX_NAME ? m->entry_len : TPSCHED_MAX_NAME;
	memcpy(u->entry, m->entry, nl);
	u->entry[nl] = '\0';
	uint32_t rl;
	int st = run(u, buf, n, m->deadline, nl, &rl);
	atomic_store(&m->status, (uint32_t)st);
	atomic_store(&m->reply_len, rl);
	atomic_store(&u->ctl->done_no, no);
	if (atomic_load(&u->gp->reader_sleeping) != 0)
		ring(u->bell);
}

static int sock_serve_one(tpsched_uap *u);

int tpsched_serve_one(tpsched_uap *u)
{
	if (u->socket_mode)
		return sock_serve_one(u);
	if (u->area == NULL)
		return 0;
	if (u->refresh && u->served) {
		leave(u);
		return 0;
	}
	if (!u->started)
		publish(u);
	unsigned mb;
	uint64_t no = next(u, &mb);
	if (no == 0) {
		leave(u);
		return 0;
	}
	if (mb == LANE_MAILBOX)
		serve_lane(u, no);
	else
		serve(u, no, mb);
	u->served = true;
	return 1;
}

int tpsched_serve(tpsched_uap *u)
{
	for (;;) {
		int r = tpsched_serve_one(u);
		if (r <= 0)
			return r;
	}
}

/* ---- socket mode (receive_from = socket; shm/internal/sockwire) ---- */

struct sw_msg {
	uint8_t kind, status;
	uint16_t name_len;
	uint32_t pay_len;
	uint64_t a, b;
};

static void sw_put(unsigned char *h, const struct sw_msg *m)
{
	memset(h, 0, SW_HEADER);
	h[0] = m->kind;
	h[1] = m->status;
	for (int i = 0; i < 2; i++)
		h[2 + i] = (unsigned char)(m->name_len >> (8 * i));
	for (int i = 0; i < 4; i++)
		h[4 + i] = (unsigned char)(m->pay_len >> (8 * i));
	for (int i = 0; i < 8; i++) {
		h[8 + i] = (unsigned char)(m->a >> (8 * i));
		h[16 + i] = (unsigned char)(m->b >> (8 * i));
	}
}

static uint64_t le(const unsigned char *p, int n)
{
	uint64_t v = 0;
	for (int i = n - 1; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

/* read_full reads exactly n bytes: 0, or -1 with errno (0 at end of file). */
static int read_full(int fd, unsigned char *p, size_t n)
{
	while (n > 0) {
		ssize_t r = read(fd, p, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0) {
			if (r == 0)
				errno = 0;
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

/* write_all writes the iovecs whole, without SIGPIPE if the node is gone. */
static int write_all(int fd, struct iovec *iov, int cnt)
{
	while (cnt > 0) {
		struct msghdr mh = {.msg_iov = iov, .msg_iovlen = (size_t)cnt};
		ssize_t w = sendmsg(fd, &mh, MSG_NOSIGNAL);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return -1;
		while (cnt > 0 && (size_t)w >= iov->iov_len) {
			w -= (ssize_t)iov->iov_len;
			iov++;
			cnt--;
		}
		if (cnt > 0) {
			iov->iov_base = (unsigned char *)iov->iov_base + w;
			iov->iov_len -= (size_t)w;
		}
	}
	return 0;
}

/* sw_read reads one header and checks the limits every kind shares, as
 * sockwire.Read does. Returns 0, or -1 with a message in why. */
static int sw_read(int fd, struct sw_msg *m, uint64_t max_msg, char *why, size_t whylen)
{
	unsigned char h[SW_HEADER];
	if (read_full(fd, h, sizeof h) != 0) {
		if (errno == 0)
			snprintf(why, whylen, "the scheduler closed the connection");
		else
			snprintf(why, whylen, "read: %s", strerror(errno));
		return -1;
	}
	m->kind = h[0];
	m->status = h[1];
	m->name_len = (uint16_t)le(h + 2, 2);
	m->pay_len = (uint32_t)le(h + 4, 4);
	m->a = le(h + 8, 8);
	m->b = le(h + 16, 8);
	if (m->kind < SW_HELLO || m->kind > SW_BYE)
		snprintf(why, whylen, "socket protocol error: unknown message kind %u", m->kind);
	else if (m->name_len > TPSCHED_MAX_NAME || (m->name_len != 0 && m->kind != SW_REQUEST))
		snprintf(why, whylen, "socket protocol error: entry name of %u bytes in a message of kind %u", m->name_len, m->kind);
	else if (m->pay_len > max_msg)
		snprintf(why, whylen, "socket protocol error: message of %u bytes, max_message_size is %llu", m->pay_len,
			 (unsigned long long)max_msg);
	else if (m->pay_len != 0 && m->kind != SW_REQUEST && m->kind != SW_REPLY)
		snprintf(why, whylen, "socket protocol error: payload in a message of kind %u", m->kind);
	else if (m->kind == SW_REPLY && m->status >= STATUS_END)
		snprintf(why, whylen, "socket protocol error: reply status %u", m->status);
	else if (m->status != 0 && m->kind != SW_REPLY && !(m->kind == SW_HELLO && m->status == SW_HELLO_REFRESH))
		snprintf(why, whylen, "socket protocol error: status in a message of kind %u", m->kind);
	else
		return 0;
	return -1;
}

/* attach_socket is tpsched_attach in socket mode: fd is the UAP's end of
 * the socketpair. It says hello and waits for the welcome that tells
 * max_message_size. */
static tpsched_uap *attach_socket(int fd, bool refresh, char *err, size_t errlen)
{
	struct stat st;
	if (fstat(fd, &st) != 0 || !S_ISSOCK(st.st_mode)) {
		set_err(err, errlen,
			"tpsched: TPSCHED_RECEIVE=socket but fd %d is not a socket (a UAP must be started by scdd, which passes its socket as fd %d)",
			fd, fd);
		return NULL;
	}
	unsigned char h[SW_HEADER];
	struct sw_msg hello = {.kind = SW_HELLO, .status = refresh ? SW_HELLO_REFRESH : 0, .a = (uint64_t)getpid(), .b = SW_VERSION};
	sw_put(h, &hello);
	struct iovec iov = {.iov_base = h, .iov_len = sizeof h};
	if (write_all(fd, &iov, 1) != 0) {
		set_err(err, errlen, "tpsched: attach socket: hello: %s", strerror(errno));
		close(fd);
		return NULL;
	}
	struct sw_msg m;
	char why[160];
	if (sw_read(fd, &m, 0, why, sizeof why) != 0) {
		set_err(err, errlen, "tpsched: attach socket: %s", why);
		close(fd);
		return NULL;
	}
	if (m.kind != SW_WELCOME || m.b != SW_VERSION || m.a < 1 || m.a > TPSCHED_MAX_MESSAGE) {
		set_err(err, errlen,
			"tpsched: attach socket: socket protocol error: expected welcome, got kind %u (version %llu, max message %llu)",
			m.kind, (unsigned long long)m.b, (unsigned long long)m.a);
		close(fd);
		return NULL;
	}
	tpsched_uap *u = new_uap();
	if (u == NULL) {
		set_err(err, errlen, "tpsched: attach socket: %s", strerror(errno));
		close(fd);
		return NULL;
	}
	u->socket_mode = true;
	u->sock = fd;
	u->max_msg = (size_t)m.a;
	u->refresh = refresh;
	prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	return u;
}

/* sock_bye says the process leaves: socket mode's leave(). */
static void sock_bye(tpsched_uap *u)
{
	unsigned char h[SW_HEADER];
	struct sw_msg bye = {.kind = SW_BYE};
	sw_put(h, &bye);
	struct iovec iov = {.iov_base = h, .iov_len = sizeof h};
	(void)write_all(u->sock, &iov, 1);
}

/* sock_leave says bye and closes the socket. */
static void sock_leave(tpsched_uap *u)
{
	sock_bye(u);
	close(u->sock);
	u->sock = -1;
}

static int sock_fail(tpsched_uap *u, const char *why)
{
	snprintf(u->err, sizeof u->err, "tpsched: socket: %s", why);
	close(u->sock);
	u->sock = -1;
	return -1;
}

/* sock_serve_one is tpsched_serve_one in socket mode. */
static int sock_serve_one(tpsched_uap *u)
{
	if (u->sock < 0)
		return 0;
	if (u->refresh && u->served) {
		sock_leave(u);
		return 0;
	}
	struct sw_msg m;
	char why[160];
	if (sw_read(u->sock, &m, u->max_msg, why, sizeof why) != 0)
		return sock_fail(u, why);
	if (m.kind == SW_STOP || m.kind == SW_CLOSE) {
		sock_leave(u);
		return 0;
	}
	if (m.kind != SW_REQUEST) {
		snprintf(why, sizeof why, "socket protocol error: message of kind %u from the scheduler", m.kind);
		return sock_fail(u, why);
	}
	if (u->sock_buf == NULL) {
		u->sock_buf = malloc(u->max_msg);
		if (u->sock_buf == NULL)
			return sock_fail(u, "no memory for the request buffer");
	}
	if (read_full(u->sock, (unsigned char *)u->entry, m.name_len) != 0 ||
	    read_full(u->sock, u->sock_buf, m.pay_len) != 0)
		return sock_fail(u, errno == 0 ? "the scheduler closed the connection" : strerror(errno));
	u->entry[m.name_len] = '\0';
	uint32_t rl;
	int st = run(u, u->sock_buf, m.pay_len, (int64_t)m.b, m.name_len, &rl);
	unsigned char h[SW_HEADER];
	struct sw_msg reply = {.kind = SW_REPLY, .status = (uint8_t)st, .pay_len = rl, .a = m.a};
	sw_put(h, &reply);
	struct iovec iov[2] = {{.iov_base = h, .iov_len = sizeof h}, {.iov_base = u->sock_buf, .iov_len = rl}};
	if (write_all(u->sock, iov, rl > 0 ? 2 : 1) != 0)
		return sock_fail(u, strerror(errno));
	u->served = true;
	return 1;
}

int tpsched_close(tpsched_uap *u)
{
	if (u == NULL)
		return 0;
	int rc = 0, saved = 0;
	if (u->area != NULL) {
		drop_lane(u);
		leave_lane_in(u);
		leave(u);
		/* All three, whichever fails. */
		int e1 = munmap(u->area, u->area_len) != 0 ? errno : 0;
		int e2 = munmap((void *)u->page, u->page_len) != 0 ? errno : 0;
		int e3 = close(u->bell) != 0 ? errno : 0;
		if (e1 || e2 || e3) {
			rc = -1;
			saved = e1 ? e1 : e2 ? e2 : e3;
		}
	}
	if (u->sock >= 0) {
		/* Serving did not leave: say so, as leave() does above, or the
		 * node takes the process for a ready one until it exits. */
		sock_bye(u);
		if (close(u->sock) != 0) {
			rc = -1;
			saved = errno;
		}
	}
	for (int r = 0; r <= ROLE_CALLER; r++)
		if (u->got[r].fd >= 0)
			close(u->got[r].fd);
	if (u->line >= 0)
		close(u->line);
	free(u->sock_buf);
	free(u);
	if (rc != 0)
		errno = saved;
	return rc;
}
