/*
 * uap-echo-c: the example UAP in C, a twin of the Go uap-echo (cmd/uap-echo)
 * built on uap-c/tpsched_uap.h alone. scdd starts it to serve a service
 * group; `make uap-c` builds it into bin/.
 *
 * Services:
 *
 *   echo   replies with the request
 *   sleep  sleeps the number of milliseconds in the request (decimal text)
 *   burn   spins the CPU for the number of microseconds in the request, of wall-clock time
 *   cpu    spins until its thread has used the number of microseconds of CPU time in the request
 *
 * sleep, burn and cpu reply with the request, in which a space may follow
 * the number with anything after it.
 *
 *   fail   returns an application error
 *   crash  dies in the middle of the call (SIGSEGV, after it began writing
 *          its reply), as a broken UAP would
 *   pid    replies with the process id (to see which process served a call)
 *   calls  replies with the number of calls this process's handlers ran,
 *          this one included (to see that no call ran twice or in vain)
 *   call   calls another service through the node (tpsched_call_service):
 *          the request is "group/service/request"; it replies with that
 *          call's reply, or fails with its error
 *
 * TPSCHED_ECHO_SLOWDOWN=k (an integer, default 1) makes sleep, burn and cpu
 * take k times as long, as it does for uap-echo.
 *
 * uap-echo-c -version prints its version; scdd starts it with no arguments.
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tpsched_uap.h"

#ifndef UAP_VERSION
#define UAP_VERSION "(devel)"
#endif

static long long slowdown = 1;
static unsigned long long runs; /* handler runs in this process */

/* number reads the decimal number a request starts with; what follows a
 * space is a tag the reply carries back. -1 if there is none. */
static long long number(const tpsched_call *call)
{
	size_t i = 0;
	while (i < call->len && call->buf[i] == ' ')
		i++;
	long long n = 0;
	size_t digits = 0;
	for (; i < call->len && call->buf[i] >= '0' && call->buf[i] <= '9' && digits < 15; i++, digits++)
		n = n * 10 + (call->buf[i] - '0');
	if (digits == 0 || (i < call->len && call->buf[i] != ' ' && call->buf[i] != '\n'))
		return -1;
	return n * slowdown;
}

static int bad_number(tpsched_call *call)
{
	int n = call->len > 40 ? 40 : (int)call->len;
	return tpsched_app_error(call, "want a non-negative decimal number, got \"%.*s\"", n, (const char *)call->buf);
}

static int echo(tpsched_call *call)
{
	(void)call;
	return TPSCHED_OK; /* the reply is the request, already in place */
}

static int sleep_ms(tpsched_call *call)
{
	long long ms = number(call);
	if (ms < 0)
		return bad_number(call);
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
	return TPSCHED_OK;
}

static volatile uint64_t sink;

static int64_t now_ns(clockid_t clk)
{
	struct timespec ts;
	clock_gettime(clk, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* spin keeps the CPU busy until clock clk has advanced by us microseconds,
 * reading the clock rarely so that the loop itself is the work. */
static void spin(clockid_t clk, long long us)
{
	int64_t end = now_ns(clk) + us * 1000;
	uint64_t x = 1;
	while (now_ns(clk) < end)
		for (int i = 0; i < 1000; i++)
			x = x * 6364136223846793005ULL + 1442695040888963407ULL;
	sink = x;
}

static int burn(tpsched_call *call)
{
	long long us = number(call);
	if (us < 0)
		return bad_number(call);
	spin(CLOCK_MONOTONIC, us);
	return TPSCHED_OK;
}

static int cpu(tpsched_call *call)
{
	long long us = number(call);
	if (us < 0)
		return bad_number(call);
	spin(CLOCK_THREAD_CPUTIME_ID, us);
	return TPSCHED_OK;
}

static int fail(tpsched_call *call) { return tpsched_app_error(call, "failure requested"); }

static int pid(tpsched_call *call)
{
	int n = snprintf((char *)call->buf, call->cap, "%ld", (long)getpid());
	call->len = n < 0 ? 0 : (size_t)n < call->cap ? (size_t)n : call->cap;
	return TPSCHED_OK;
}

static int calls(tpsched_call *call)
{
	/* A reply of its own, which the library copies into the buffer. */
	static char out[24];
	int n = snprintf(out, sizeof out, "%llu", runs);
	call->buf = (unsigned char *)out;
	call->len = n < 0 ? 0 : (size_t)n;
	return TPSCHED_OK;
}

static int call_other(tpsched_call *call)
{
	char group[TPSCHED_MAX_NAME], service[TPSCHED_MAX_NAME];
	const unsigned char *p = call->buf, *end = call->buf + call->len;
	const unsigned char *s1 = memchr(p, '/', call->len);
	const unsigned char *s2 = s1 ? memchr(s1 + 1, '/', (size_t)(end - s1 - 1)) : NULL;
	if (s2 == NULL || s1 - p >= TPSCHED_MAX_NAME || s2 - s1 - 1 >= TPSCHED_MAX_NAME)
		return tpsched_app_error(call, "want group/service/request");
	memcpy(group, p, (size_t)(s1 - p));
	group[s1 - p] = '\0';
	memcpy(service, s1 + 1, (size_t)(s2 - s1 - 1));
	service[s2 - s1 - 1] = '\0';
	/* The answer goes over the request, in the call's own buffer. */
	static unsigned char req[1 << 20];
	size_t rl = (size_t)(end - s2 - 1);
	if (rl > sizeof req)
		return tpsched_app_error(call, "request too big for the example");
	memcpy(req, s2 + 1, rl);
	size_t n;
	int code = tpsched_call_service(call->uap, group, service, req, rl, call->buf, call->cap, &n, 0);
	if (code < 0)
		return tpsched_app_error(call, "call %s/%s: %s", group, service, strerror(errno));
	if (code != 0) {
		char msg[256];
		snprintf(msg, sizeof msg, "%.*s", (int)n, (const char *)call->buf);
		return tpsched_app_error(call, "call %s/%s: %s", group, service, msg);
	}
	call->len = n;
	return TPSCHED_OK;
}

static int crash(tpsched_call *call)
{
	/* Half a reply written, then the process dies: the node must not
	 * take the buffer for an answer. */
	const char partial[] = "partial reply";
	size_t n = sizeof partial - 1 < call->cap ? sizeof partial - 1 : call->cap;
	memcpy(call->buf, partial, n);
	signal(SIGSEGV, SIG_DFL);
	raise(SIGSEGV);
	return TPSCHED_OK; /* not reached */
}

/* counted runs the handler its arg points to, and counts the run: an
 * example of the arg that tpsched_handle passes through. */
static int counted(tpsched_call *call)
{
	runs++;
	return (*(const tpsched_handler *)call->arg)(call);
}

int main(int argc, char **argv)
{
	if (argc > 1 && (strcmp(argv[1], "-version") == 0 || strcmp(argv[1], "--version") == 0)) {
		printf("uap-echo-c %s (C, tpsched_uap layout %d)\n", UAP_VERSION, TPSCHED_LAYOUT_VERSION);
		return 0;
	}
	if (argc > 1) {
		fprintf(stderr, "usage: uap-echo-c [-version] (scdd starts it with no arguments)\n");
		return 2;
	}
	const char *sd = getenv("TPSCHED_ECHO_SLOWDOWN");
	if (sd != NULL && *sd != '\0') {
		char *end;
		slowdown = strtoll(sd, &end, 10);
		if (*end != '\0' || slowdown < 1) {
			fprintf(stderr, "uap-echo-c: TPSCHED_ECHO_SLOWDOWN=\"%s\": want a whole number >= 1\n", sd);
			return 2;
		}
	}
	char err[512];
	tpsched_uap *u = tpsched_attach(err, sizeof err);
	if (u == NULL) {
		fprintf(stderr, "uap-echo-c: %s\n", err);
		return 2;
	}
	static const struct {
		const char *entry;
		tpsched_handler h;
	} services[] = {
		{"echo", echo}, {"sleep", sleep_ms}, {"burn", burn}, {"cpu", cpu},
		{"fail", fail}, {"pid", pid},        {"calls", calls}, {"crash", crash}, {"call", call_other},
	};
	for (size_t i = 0; i < sizeof services / sizeof services[0]; i++) {
		if (tpsched_handle(u, services[i].entry, counted, (void *)&services[i].h) != 0) {
			fprintf(stderr, "uap-echo-c: register %s: %s\n", services[i].entry, strerror(errno));
			return 2;
		}
	}
	int rc = tpsched_serve(u);
	if (rc != 0)
		fprintf(stderr, "uap-echo-c: %s\n", tpsched_error(u));
	tpsched_close(u);
	return rc == 0 ? 0 : 1;
}
