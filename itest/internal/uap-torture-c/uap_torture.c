/*
 * uap-torture-c: the C twin of the torture test's UAP
 * (itest/internal/uap-torture, read its comment first), built on
 * uap-c/tpsched_uap.h alone, so that the torture test (itest/torture_test.go,
 * the attack "clanes") attacks the C UAP library as it attacks the Go one:
 * its local calls (tpsched_call_service, and the lanes the node grants it)
 * and its serving (tpsched_serve). The test compiles it together with
 * uap-c/tpsched_uap.c, from source, once per test binary.
 *
 * Every request starts "<id> <flag> <ms>" (the call's unique id, one flag
 * letter, milliseconds to sleep), maybe followed by more. Before it runs a
 * call, the process appends the line "<id> <pid> <flag> <unix ms>\n" to the
 * file $TORTURE_EXECLOG (O_APPEND, one write(2) per line: lines of
 * concurrent processes never mix), so a call that ran has its line even if
 * the process dies at once after. A request of fewer than three fields is
 * not recorded (as in the Go UAP).
 *
 * Services (the Go UAP's, with the same requests and replies):
 *
 *   work   sleeps ms, replies with the request
 *   burst  the request is "<id> <flag> <ms> <inner flag> <k> [<each ms>]":
 *          makes k local calls one after the other to $TORTURE_BURST_TARGET
 *          (group/service), the j-th with the request "<id>.in<j> <f> <m>"
 *          (f the inner flag and m ms for the last, n and each ms, or 0, for
 *          the others), each bounded by 20 s, and replies
 *          "<its request> | <the first call's reply>", or fails (an
 *          application error) with the first error
 *
 * Flags (the first process to run such a call does it; another process
 * that runs the same call again, which must never happen, serves it
 * honestly so that the run twice is seen, not hidden by a second exit):
 *
 *   n  nothing special
 *   x  exit (status 3) in the middle of the call: it holds the call taken,
 *      and perhaps more handed over behind it
 *
 * The Go UAP's flags b (a bad completion written into the process area by
 * hand) and c (a socket-mode process closing its socket) are not here: the
 * test never sends them to the C groups (which serve in shared memory), and
 * this program treats any flag but x as n.
 *
 * "The first process" is decided with a marker file "mark.<id>" created
 * O_CREAT|O_EXCL in $TORTURE_DIR, so the test needs no state in the UAP.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tpsched_uap.h"

/* The bound of each local call, as the Go UAP's context. */
#define LOCAL_CALL_TIMEOUT_MS 20000

/* The most fields a request is parsed into; more are counted, not kept. */
#define MAX_FIELDS 8

static int exec_log = -1;      /* $TORTURE_EXECLOG, O_APPEND */
static const char *marker_dir; /* $TORTURE_DIR */
static char burst_group[TPSCHED_MAX_NAME], burst_service[TPSCHED_MAX_NAME];

/* Buffers for the answers of burst's local calls: the first one's (the
 * reply carries it) and the others'. Each holds max_message bytes. */
static unsigned char *first_answer, *other_answer;
static size_t answer_cap;

/* A request split at white space, as Go's strings.Fields splits it. */
struct fields {
	int n; /* every field, kept or not */
	const char *at[MAX_FIELDS];
	int len[MAX_FIELDS];
};

static void split(const unsigned char *buf, size_t len, struct fields *f)
{
	f->n = 0;
	size_t i = 0;
	for (;;) {
		while (i < len && (buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\v' ||
				   buf[i] == '\f'))
			i++;
		if (i == len)
			return;
		size_t start = i;
		while (i < len && !(buf[i] == ' ' || buf[i] == '\t' || buf[i] == '\n' || buf[i] == '\r' || buf[i] == '\v' ||
				    buf[i] == '\f'))
			i++;
		if (f->n < MAX_FIELDS) {
			f->at[f->n] = (const char *)buf + start;
			f->len[f->n] = (int)(i - start);
		}
		f->n++;
	}
}

/* number is field i as a decimal number, 0 if it is not one (Go's
 * strconv.Atoi with its error ignored). */
static long number(const struct fields *f, int i)
{
	if (i >= f->n || i >= MAX_FIELDS || f->len[i] == 0 || f->len[i] > 9)
		return 0;
	long v = 0;
	for (int k = 0; k < f->len[i]; k++) {
		char c = f->at[i][k];
		if (c < '0' || c > '9')
			return 0;
		v = v * 10 + (c - '0');
	}
	return v;
}

static void sleep_ms(long ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
}

static long long unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* record writes this execution's line into the execution log, in one
 * write(2), before the call runs. A process that cannot record exits: an
 * execution the test cannot see would hide what it is there to find. */
static void record(const struct fields *f)
{
	char line[256];
	int n = snprintf(line, sizeof line, "%.*s %ld %.*s %lld\n", f->len[0], f->at[0], (long)getpid(), f->len[1], f->at[1],
			 unix_ms());
	if (n < 0 || (size_t)n >= sizeof line || write(exec_log, line, (size_t)n) != n) {
		fprintf(stderr, "uap-torture-c: recording an execution: %s\n", strerror(errno));
		_exit(2);
	}
}

/* first reports whether this process is the first to do the special part
 * of the call whose id is field 0. */
static int first(const struct fields *f)
{
	char path[4096];
	int n = snprintf(path, sizeof path, "%s/mark.%.*s", marker_dir, f->len[0], f->at[0]);
	if (n < 0 || (size_t)n >= sizeof path)
		return 0;
	int fd = open(path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0666);
	if (fd < 0)
		return 0;
	close(fd);
	return 1;
}

/* run records the call's execution and does what its flag says; false for a
 * request of fewer than three fields (not recorded, as in the Go UAP). */
static int run(const struct fields *f)
{
	if (f->n < 3)
		return 0;
	record(f);
	if (f->len[1] == 1 && f->at[1][0] == 'x' && first(f))
		_exit(3); /* as Go's os.Exit: no atexit handlers, nothing flushed */
	return 1;
}

static int work(tpsched_call *call)
{
	struct fields f;
	split(call->buf, call->len, &f);
	if (run(&f))
		sleep_ms(number(&f, 2));
	return TPSCHED_OK; /* the reply is the request, in place */
}

static int burst(tpsched_call *call)
{
	struct fields f;
	split(call->buf, call->len, &f);
	long ms = run(&f) ? number(&f, 2) : 0;
	long k = 0, each = 0;
	if (f.n == 5 || f.n == 6)
		k = number(&f, 4);
	if (f.n == 6)
		each = number(&f, 5);
	if (k < 1) {
		int n = call->len > 40 ? 40 : (int)call->len;
		return tpsched_app_error(call, "want \"<id> <flag> <ms> <inner flag> <k> [<each ms>]\", got \"%.*s\"", n,
					 (const char *)call->buf);
	}
	size_t first_len = 0;
	for (long j = 1; j <= k; j++) {
		const char *inner_flag = "n";
		int inner_flag_len = 1;
		long inner_ms = each;
		if (j == k) {
			inner_flag = f.at[3];
			inner_flag_len = f.len[3];
			inner_ms = ms;
		}
		char req[128];
		int rl = snprintf(req, sizeof req, "%.*s.in%ld %.*s %ld", f.len[0], f.at[0], j, inner_flag_len, inner_flag,
				  inner_ms);
		if (rl < 0 || (size_t)rl >= sizeof req)
			return tpsched_app_error(call, "local call %ld of %ld: request too long", j, k);
		unsigned char *out = j == 1 ? first_answer : other_answer;
		size_t out_len = 0;
		int code = tpsched_call_service(call->uap, burst_group, burst_service, req, (size_t)rl, out, answer_cap,
						&out_len, LOCAL_CALL_TIMEOUT_MS);
		if (code < 0)
			return tpsched_app_error(call, "local call %ld of %ld: %s", j, k, strerror(errno));
		if (code != 0) {
			int n = out_len > 512 ? 512 : (int)out_len;
			return tpsched_app_error(call, "local call %ld of %ld: code %d: %.*s", j, k, code, n,
						 (const char *)out);
		}
		if (j == 1)
			first_len = out_len;
	}
	/* The request is still in buf (the local calls answered into buffers
	 * of their own): append " | " and the first call's reply. */
	static const char sep[] = " | ";
	if (call->len + (sizeof sep - 1) + first_len > call->cap)
		return tpsched_app_error(call, "reply too big: %zu bytes", call->len + (sizeof sep - 1) + first_len);
	memcpy(call->buf + call->len, sep, sizeof sep - 1);
	memcpy(call->buf + call->len + (sizeof sep - 1), first_answer, first_len);
	call->len += (sizeof sep - 1) + first_len;
	return TPSCHED_OK;
}

/* burst_target splits $TORTURE_BURST_TARGET (group/service); an empty or
 * malformed target leaves the names empty, and burst's calls then fail with
 * the library's EINVAL, as the Go UAP's do. */
static void burst_target(void)
{
	const char *target = getenv("TORTURE_BURST_TARGET");
	const char *slash = target ? strchr(target, '/') : NULL;
	if (slash == NULL || slash - target >= TPSCHED_MAX_NAME || strlen(slash + 1) >= TPSCHED_MAX_NAME)
		return;
	memcpy(burst_group, target, (size_t)(slash - target));
	burst_group[slash - target] = '\0';
	strcpy(burst_service, slash + 1);
}

int main(void)
{
	marker_dir = getenv("TORTURE_DIR");
	const char *log_path = getenv("TORTURE_EXECLOG");
	if (marker_dir == NULL || log_path == NULL) {
		fprintf(stderr, "uap-torture-c: TORTURE_DIR and TORTURE_EXECLOG must be set\n");
		return 2;
	}
	exec_log = open(log_path, O_WRONLY | O_APPEND | O_CLOEXEC);
	if (exec_log < 0) {
		fprintf(stderr, "uap-torture-c: %s: %s\n", log_path, strerror(errno));
		return 2;
	}
	burst_target();
	char err[512];
	tpsched_uap *u = tpsched_attach(err, sizeof err);
	if (u == NULL) {
		fprintf(stderr, "uap-torture-c: %s\n", err);
		return 2;
	}
	answer_cap = tpsched_max_message(u);
	first_answer = malloc(answer_cap);
	other_answer = malloc(answer_cap);
	if (first_answer == NULL || other_answer == NULL) {
		fprintf(stderr, "uap-torture-c: no memory for two answers of %zu bytes\n", answer_cap);
		return 2;
	}
	if (tpsched_handle(u, "work", work, NULL) != 0 || tpsched_handle(u, "burst", burst, NULL) != 0) {
		fprintf(stderr, "uap-torture-c: registering the services: %s\n", strerror(errno));
		return 2;
	}
	int rc = tpsched_serve(u);
	if (rc != 0)
		fprintf(stderr, "uap-torture-c: %s\n", tpsched_error(u));
	tpsched_close(u);
	return rc == 0 ? 0 : 1;
}
