/*
 * uap-caller-c: the bench's caller UAP in C, a twin of the Go uap-caller
 * (bench/cmd/uap-caller) built on uap-c/tpsched_uap.h alone, as Enduro/X's
 * exbenchcl is C: S10's "tpsched C local call" is N of these calling
 * uap-echo-c, so that both sides of the comparison run without a language
 * runtime. `make bench` builds it into bin/ when a C compiler is there.
 *
 *   run   the request is package uapcall's run request, "run1 group service
 *         payload start end" (times in Unix nanoseconds); it calls
 *         group/service with a payload-byte request, one call after the
 *         other, until end, and replies with uapcall's summary:
 *         "pid=P ok=N refused=N failed=N timedout=N bad=N inwindow=N
 *         hist=bucket:count,..."
 *
 * The payload, the outcome of a call, the window's rules and the histogram's
 * buckets are uapcall's (bench/uapcall/uapcall.go); bench's
 * TestCCallerAnswersARun runs this program under a real scdd and reads its
 * summary with uapcall's parser.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tpsched_uap.h"

/* How long after the run's end a call may still wait for its answer, as the
 * Go caller's callGrace. */
#define CALL_GRACE_NS 2000000000LL

/* The frame protocol's codes that uapcall tells apart. */
#define CODE_SERVER_BUSY 4
#define CODE_TIMED_OUT 5

/* uapcall's histogram: 2^SUB_BITS buckets per power of two, exact below
 * 2^(SUB_BITS+1) ns. MAX_BUCKET is uapcall's maxBucket. */
#define SUB_BITS 6
#define MAX_BUCKET ((62 - SUB_BITS) << SUB_BITS)

enum outcome { OK, REFUSED, FAILED, TIMED_OUT, BAD };

struct tally {
	int64_t start, end;
	long long n[5]; /* calls sent in the window, by outcome */
	long long in_window;
	uint64_t hist[MAX_BUCKET + 1];
};

static int64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int bucket_of(uint64_t v)
{
	if (v < 1u << (SUB_BITS + 1))
		return (int)v;
	int shift = 64 - __builtin_clzll(v) - (SUB_BITS + 1);
	int i = (shift << SUB_BITS) + (int)(v >> shift);
	return i > MAX_BUCKET ? MAX_BUCKET : i;
}

/* count is uapcall's Tally.Count. */
static void count(struct tally *t, int64_t sent, int64_t done, enum outcome o)
{
	int in_window = o == OK && done >= t->start && done <= t->end;
	if (sent < t->start) {
		t->in_window += in_window;
		return;
	}
	t->n[o]++;
	if (o == OK) {
		t->hist[bucket_of(done > sent ? (uint64_t)(done - sent) : 0)]++;
		t->in_window += in_window;
	}
}

/* outcome_of is uapcall's OutcomeOf. */
static enum outcome outcome_of(int code, const unsigned char *reply, size_t n, const unsigned char *req, size_t len)
{
	switch (code) {
	case 0:
		if (n != len || (len > 0 && (reply[0] != req[0] || reply[len - 1] != req[len - 1])))
			return BAD;
		return OK;
	case CODE_SERVER_BUSY:
		return REFUSED;
	case CODE_TIMED_OUT:
		return TIMED_OUT;
	}
	return FAILED;
}

static int run(tpsched_call *call)
{
	char group[TPSCHED_MAX_NAME], service[TPSCHED_MAX_NAME], tag[8];
	long long payload, start, end;
	char text[256];
	size_t tl = call->len < sizeof text - 1 ? call->len : sizeof text - 1;
	memcpy(text, call->buf, tl);
	text[tl] = '\0';
	if (sscanf(text, "%7s %31s %31s %lld %lld %lld", tag, group, service, &payload, &start, &end) != 6 ||
	    strcmp(tag, "run1") != 0 || payload < 0 || (size_t)payload > call->cap || start < 0 || end < start)
		return tpsched_app_error(call, "a run request is \"run1 group service payload start end\", got \"%.60s\"", text);

	size_t len = (size_t)payload;
	unsigned char *req = malloc(len + 1), *reply = malloc(call->cap);
	struct tally *t = calloc(1, sizeof *t);
	if (req == NULL || reply == NULL || t == NULL) {
		free(req), free(reply), free(t);
		return tpsched_app_error(call, "out of memory");
	}
	for (size_t i = 0; i < len; i++)
		req[i] = (unsigned char)(i * 7 + 1); /* uapcall.Payload */
	t->start = start, t->end = end;
	for (;;) {
		int64_t sent = now_ns();
		if (sent >= end)
			break;
		int64_t left_ms = (end + CALL_GRACE_NS - sent) / 1000000;
		size_t n = 0;
		int code = tpsched_call_service(call->uap, group, service, req, len, reply, call->cap, &n,
						(uint32_t)(left_ms < 1 ? 1 : left_ms));
		int64_t done = now_ns();
		if (code < 0) {
			/* No answer from the node at all: do not spin on it. */
			count(t, sent, done, FAILED);
			nanosleep(&(struct timespec){.tv_nsec = 1000000}, NULL);
			continue;
		}
		count(t, sent, done, outcome_of(code, reply, n, req, len));
	}

	int w = snprintf((char *)call->buf, call->cap,
			 "pid=%d ok=%lld refused=%lld failed=%lld timedout=%lld bad=%lld inwindow=%lld hist=", (int)getpid(),
			 t->n[OK], t->n[REFUSED], t->n[FAILED], t->n[TIMED_OUT], t->n[BAD], t->in_window);
	const char *sep = "";
	for (int i = 0; i <= MAX_BUCKET && w >= 0 && (size_t)w < call->cap; i++) {
		if (t->hist[i] == 0)
			continue;
		w += snprintf((char *)call->buf + w, call->cap - (size_t)w, "%s%d:%" PRIu64, sep, i, t->hist[i]);
		sep = ",";
	}
	free(req), free(reply), free(t);
	if (w < 0 || (size_t)w >= call->cap)
		return tpsched_app_error(call, "the summary does not fit max_message_size %zu", call->cap);
	call->len = (size_t)w;
	return TPSCHED_OK;
}

int main(void)
{
	char err[256];
	tpsched_uap *u = tpsched_attach(err, sizeof err);
	if (u == NULL) {
		fprintf(stderr, "uap-caller-c: %s\n", err);
		return 2;
	}
	if (tpsched_handle(u, "run", run, NULL) != 0) {
		perror("uap-caller-c: tpsched_handle");
		return 2;
	}
	int rc = tpsched_serve(u);
	if (rc != 0)
		fprintf(stderr, "uap-caller-c: %s\n", tpsched_error(u));
	tpsched_close(u);
	return rc == 0 ? 0 : 1;
}
