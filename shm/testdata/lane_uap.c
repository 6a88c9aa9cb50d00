/*
 * lane_uap.c: the helper UAP of the lane tests (shm/lane_test.go) in C, on
 * the C library (uap-c/), with the Go helper's entries, requests and
 * answers, so that each lane test runs alike with either library on either
 * end of the lane:
 *
 *   echo   replies with the request
 *   fail   fails with "failed: <request>"
 *   relay  calls the service its request names ("group/service/request")
 *          and replies with the answer, or "error <code>: <message>"
 *   loop   calls "group/service/N" N times with a 128-byte request and
 *          replies with how long the calls took, in ns
 *   sleep  sleeps "<n>ms" or "<n>s", and replies with the request
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tpsched_uap.h"

static int echo(tpsched_call *call)
{
	(void)call;
	return TPSCHED_OK;
}

static int fail(tpsched_call *call)
{
	return tpsched_app_error(call, "failed: %.*s", (int)call->len, (const char *)call->buf);
}

/* split parses "group/service/rest" in the call's buffer. */
static int split(tpsched_call *call, char *group, char *service, const unsigned char **rest, size_t *rest_len)
{
	const unsigned char *p = call->buf, *end = call->buf + call->len;
	const unsigned char *s1 = memchr(p, '/', call->len);
	const unsigned char *s2 = s1 ? memchr(s1 + 1, '/', (size_t)(end - s1 - 1)) : NULL;
	if (s2 == NULL || s1 - p >= TPSCHED_MAX_NAME || s2 - s1 - 1 >= TPSCHED_MAX_NAME)
		return -1;
	memcpy(group, p, (size_t)(s1 - p));
	group[s1 - p] = '\0';
	memcpy(service, s1 + 1, (size_t)(s2 - s1 - 1));
	service[s2 - s1 - 1] = '\0';
	*rest = s2 + 1;
	*rest_len = (size_t)(end - s2 - 1);
	return 0;
}

static unsigned char req[1 << 20], out[1 << 20];

static int relay(tpsched_call *call)
{
	char group[TPSCHED_MAX_NAME], service[TPSCHED_MAX_NAME];
	const unsigned char *rest;
	size_t rl, n;
	if (split(call, group, service, &rest, &rl) != 0)
		return tpsched_app_error(call, "relay wants group/service/request");
	memcpy(req, rest, rl);
	int code = tpsched_call_service(call->uap, group, service, req, rl, out, sizeof out, &n, 0);
	if (code < 0)
		return tpsched_app_error(call, "call %s/%s: %s", group, service, strerror(errno));
	if (code != 0) {
		int k = snprintf((char *)call->buf, call->cap, "error %d: %.*s", code, (int)n, (const char *)out);
		call->len = k < 0 ? 0 : (size_t)k < call->cap ? (size_t)k : call->cap;
		return TPSCHED_OK;
	}
	if (n > call->cap)
		return tpsched_app_error(call, "a reply of %zu bytes", n);
	memcpy(call->buf, out, n);
	call->len = n;
	return TPSCHED_OK;
}

static long long now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int loop(tpsched_call *call)
{
	char group[TPSCHED_MAX_NAME], service[TPSCHED_MAX_NAME], num[24];
	const unsigned char *rest;
	size_t rl, n;
	if (split(call, group, service, &rest, &rl) != 0 || rl == 0 || rl >= sizeof num)
		return tpsched_app_error(call, "loop wants group/service/N");
	memcpy(num, rest, rl);
	num[rl] = '\0';
	long long k = atoll(num);
	memset(req, 0, 128);
	long long start = now_ns();
	for (long long i = 0; i < k; i++) {
		int code = tpsched_call_service(call->uap, group, service, req, 128, out, sizeof out, &n, 0);
		if (code != 0)
			return tpsched_app_error(call, "call %lld: %d", i, code);
	}
	int w = snprintf((char *)call->buf, call->cap, "%lld", now_ns() - start);
	call->len = w < 0 ? 0 : (size_t)w;
	return TPSCHED_OK;
}

static int sleep_for(tpsched_call *call)
{
	char text[32];
	size_t l = call->len < sizeof text - 1 ? call->len : sizeof text - 1;
	memcpy(text, call->buf, l);
	text[l] = '\0';
	char *unit;
	long long n = strtoll(text, &unit, 10);
	long long ms = strcmp(unit, "ms") == 0 ? n : strcmp(unit, "s") == 0 ? n * 1000 : -1;
	if (ms < 0)
		return tpsched_app_error(call, "sleep wants <n>ms or <n>s, got \"%s\"", text);
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
		;
	return TPSCHED_OK;
}

int main(void)
{
	char err[512];
	tpsched_uap *u = tpsched_attach(err, sizeof err);
	if (u == NULL) {
		fprintf(stderr, "lane_uap: %s\n", err);
		return 2;
	}
	tpsched_handle(u, "echo", echo, NULL);
	tpsched_handle(u, "fail", fail, NULL);
	tpsched_handle(u, "relay", relay, NULL);
	tpsched_handle(u, "loop", loop, NULL);
	tpsched_handle(u, "sleep", sleep_for, NULL);
	int rc = tpsched_serve(u);
	if (rc != 0)
		fprintf(stderr, "lane_uap: %s\n", tpsched_error(u));
	tpsched_close(u);
	return rc == 0 ? 0 : 1;
}
