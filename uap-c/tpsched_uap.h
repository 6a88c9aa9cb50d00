/*
 * tpsched_uap.h: write a tpsched UAP (user application program) in C.
 *
 * A UAP is a worker process that scdd starts to serve the calls of one
 * service group. It receives each call in shared memory from the node, runs
 * the handler registered for the call's entry name on the request, and
 * answers in place. This library speaks the node's shared-memory protocol
 * (docs/SHM.md, layout version 5) exactly as the Go package tpsched/shm
 * does; it needs C11 and libc only (Linux 5.1 or later, amd64 or arm64).
 *
 * Usage:
 *
 *     #include "tpsched_uap.h"
 *
 *     static int echo(tpsched_call *call)
 *     {
 *         return TPSCHED_OK;           // the request is the reply: len stays
 *     }
 *
 *     int main(void)
 *     {
 *         char err[256];
 *         tpsched_uap *u = tpsched_attach(err, sizeof err);
 *         if (u == NULL) {
 *             fprintf(stderr, "%s\n", err);
 *             return 2;
 *         }
 *         tpsched_handle(u, "echo", echo, NULL);
 *         int rc = tpsched_serve(u);   // returns 0 when the node says leave
 *         if (rc != 0)
 *             fprintf(stderr, "%s\n", tpsched_error(u));
 *         tpsched_close(u);
 *         return rc == 0 ? 0 : 1;
 *     }
 *
 * Build: cc -std=c11 -O2 -c tpsched_uap.c, then link tpsched_uap.o (or
 * libtpsched_uap.a, which `make uap-c` builds into bin/) into the program.
 *
 * Threads: a tpsched_uap serves one call at a time and is not safe for
 * concurrent use; a handler may start threads of its own, but must be done
 * with the buffer when it returns.
 *
 * Crashes: nothing to do. A process that dies in a handler (a signal,
 * abort, exit) gets its call answered 'server terminated' by the node, which
 * starts another process in its place. A call it had not yet started goes to
 * another process.
 *
 * Lanes: nothing to do either. When a process calls one service of another
 * group again and again (tpsched_call_service), the node may lend it one
 * process of that group, and the calls then go straight to it through a
 * shared memfd, with no thread of the node on their way (docs/SHM.md,
 * "Lanes"); the answers, errors included, are those of the node's way. A
 * process serves a lane in tpsched_serve as it serves its mailboxes. The
 * node grants lanes to processes started with a control line (fd
 * TPSCHED_SHM_FD + 3, which tpsched_attach takes), not in refresh mode;
 * TPSCHED_LANES=off in scdd's environment grants none.
 *
 * Where this is tested: shm/cuap_test.go drives the example UAP
 * (examples/uap-c) through the Go scheduler side of package shm, the spec
 * test there checks this header's layout against the tables of docs/SHM.md,
 * shm/lane_test.go runs the lane tests with this library at either end of a
 * lane (shm/testdata/lane_uap.c), and itest/cuap_test.go runs the example
 * under a real scdd (itest's TestLaneLocalCalls and the torture test's
 * clanes attack, its lanes).
 */
#ifndef TPSCHED_UAP_H
#define TPSCHED_UAP_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Statuses: what a handler returns, and how the node answers the caller. */
enum {
	TPSCHED_OK = 0,              /* buf holds the reply */
	TPSCHED_APP_ERROR = 1,       /* buf holds the error message: the caller gets 'application error' */
	TPSCHED_NO_SUCH_SERVICE = 2, /* set by the library: no handler for the entry */
	TPSCHED_TIMED_OUT = 3        /* set by the library: the deadline passed before the call started */
};

/* The longest entry name, and how many entries a UAP can register. */
#define TPSCHED_MAX_NAME 32
#define TPSCHED_MAX_ENTRIES 128

/* One call, as a handler sees it. */
typedef struct tpsched_call {
	/* The entry name (the entry part of the definition's
	 * service = "name=entry"), NUL-terminated. */
	const char *entry;
	/* The request in, the reply out: the handler writes its reply (or
	 * its error message) over the request, in place. buf is shared
	 * memory, valid only until the handler returns. A handler may
	 * instead point buf at a reply of its own (valid until it returns,
	 * inside the request or elsewhere): the library copies it. */
	unsigned char *buf;
	/* In: the request's length. Out: the reply's (or the message's);
	 * leave it as it is to answer with the request. */
	size_t len;
	/* How many bytes buf holds: the group's max_message_size. A reply
	 * longer than cap becomes an application error "reply too big". */
	size_t cap;
	/* Unix time in nanoseconds after which the caller no longer waits
	 * (the library does not start a call past it); 0: none. */
	int64_t deadline;
	/* The arg given to tpsched_handle for this entry. */
	void *arg;
	/* The process's side of its queue, for tpsched_call_service. */
	struct tpsched_uap *uap;
} tpsched_call;

/* A handler runs one call and returns TPSCHED_OK (the reply is buf[0:len])
 * or TPSCHED_APP_ERROR (the message is buf[0:len]; tpsched_app_error writes
 * one). Any other value is answered as an application error. */
typedef int (*tpsched_handler)(tpsched_call *call);

/* A UAP's side of its schedule queue. */
typedef struct tpsched_uap tpsched_uap;

/* tpsched_attach attaches the calling process, started by scdd, to its
 * schedule queue, as the environment says: its process area is fd
 * TPSCHED_SHM_FD (default 3), the group page the next fd and its doorbell
 * the one after; TPSCHED_REFRESH=1 serves one call and leaves. With
 * TPSCHED_RECEIVE=socket (receive_from = socket in the definition) fd
 * TPSCHED_SHM_FD is instead a connected unix stream socket to the node;
 * handlers and serve work the same. It also makes the process not dumpable
 * (PR_SET_DUMPABLE 0), so that other processes of its user cannot open its
 * descriptors through /proc.
 *
 * On failure it returns NULL and writes a message (NUL-terminated, cut to
 * errlen) into err, if err is not NULL. */
tpsched_uap *tpsched_attach(char *err, size_t errlen);

/* tpsched_attach_fds is tpsched_attach for shared memory with the
 * descriptors given: the process area, the group page and the doorbell
 * eventfd. The UAP owns them from then on. It takes no control line, so
 * the process takes no lanes. */
tpsched_uap *tpsched_attach_fds(int area, int group, int bell, char *err, size_t errlen);

/* tpsched_handle registers the handler of an entry before serving; arg is
 * passed to it in call->arg. Registering an entry again replaces its
 * handler. Returns 0, or -1 with errno: EINVAL (no name, or no handler),
 * ENAMETOOLONG (over TPSCHED_MAX_NAME bytes), ENOSPC (TPSCHED_MAX_ENTRIES
 * registered), EBUSY (serving has begun: the node has the entry list). */
int tpsched_handle(tpsched_uap *u, const char *entry, tpsched_handler h, void *arg);

/* tpsched_serve serves calls one at a time until the node asks the process
 * to leave (stop, the node closing, or after one call in refresh mode), then
 * says so to the node and returns 0. It returns -1 when it cannot go on (in
 * socket mode: the connection broke or the node broke the protocol);
 * tpsched_error says why. */
int tpsched_serve(tpsched_uap *u);

/* tpsched_serve_one waits for exactly one call and serves it: 1 when it
 * served one, 0 when the process is to leave (as tpsched_serve), -1 on
 * error. */
int tpsched_serve_one(tpsched_uap *u);

/* tpsched_max_message is the largest request or reply: the group's
 * max_message_size. */
size_t tpsched_max_message(const tpsched_uap *u);

/* tpsched_call_service calls service of group through the node, from
 * inside a handler, as a client would: through the process's shared
 * memory (no socket), routed by the node to its own queue of the group or
 * to another node. req[0:req_len] is the request. The answer is copied
 * into out[0:*out_len]: the reply, or the node's message for an error.
 *
 * It returns 0 for a reply, or the frame protocol's error code (4 server
 * busy, 5 timed out, 7 server terminated, 10 application error, ...; see
 * docs/SHM.md) with its message; or -1 with errno: EINVAL (a name empty
 * or of 32 bytes or more, a request over max_message), ENOTSUP (socket
 * mode), ETIMEDOUT (the served call's deadline has passed), EMSGSIZE (the
 * answer did not fit out_cap: out holds its start).
 *
 * timeout_ms bounds the wait; 0: the deadline of the call being served,
 * else the target group's watch_time. One call at a time per process. A
 * process waiting for its call serves nothing: a service that calls its
 * own group needs processes to spare. */
int tpsched_call_service(tpsched_uap *u, const char *group, const char *service, const void *req, size_t req_len, void *out,
			 size_t out_cap, size_t *out_len, uint32_t timeout_ms);

/* tpsched_app_error writes a printf-style message into call->buf as its
 * reply (cut to 1023 bytes and to cap) and returns TPSCHED_APP_ERROR, so
 * that a handler can `return tpsched_app_error(call, "no stock: %s", id);`.
 * Call it with buf as the library gave it. */
int tpsched_app_error(tpsched_call *call, const char *fmt, ...)
#if defined(__GNUC__)
	__attribute__((format(printf, 2, 3)))
#endif
	;

/* tpsched_error is the message of the last error of tpsched_serve or
 * tpsched_serve_one ("" if none). */
const char *tpsched_error(const tpsched_uap *u);

/* tpsched_close says the process leaves (if serving did not already),
 * unmaps and closes what attach took, and frees u. Serving must have
 * returned. Returns 0, or -1 with errno if releasing failed. */
int tpsched_close(tpsched_uap *u);

/* tpsched_status_name names a status: "ok", "application error", ... */
const char *tpsched_status_name(int status);

#ifdef __cplusplus
}
#endif

/*
 * The shared-memory layout (docs/SHM.md). The library uses these; a UAP
 * does not need them. The spec test (shm/spec_test.go) compiles a program
 * that asserts every offset and size here against the tables of
 * docs/SHM.md, as it asserts the Go side's, so neither can drift.
 */
#ifndef __cplusplus
#include <stdatomic.h>

#define TPSCHED_LAYOUT_VERSION 5
#define TPSCHED_PAGE_SIZE 4096
#define TPSCHED_GROUP_MAGIC UINT64_C(0x5052474843535054) /* "TPSCHGRP" little-endian */
#define TPSCHED_PROC_MAGIC UINT64_C(0x4352504843535054)  /* "TPSCHPRC" */
#define TPSCHED_MAX_MESSAGE (UINT32_C(1) << 30)            /* the largest max_message_size */
#define TPSCHED_ENTRY_TABLE 0x1000                          /* page 1 of a process area */
#define TPSCHED_BUFFERS 0x2000                              /* a buffer per mailbox follows */

/* Claim states, in the low two bits of a mailbox's claim word. */
enum { TPSCHED_CLAIM_OFFERED = 0, TPSCHED_CLAIM_TAKEN = 1, TPSCHED_CLAIM_REVOKED = 2 };

/* Process states, in a process area's state word. */
enum { TPSCHED_STATE_NEW = 0, TPSCHED_STATE_READY = 1, TPSCHED_STATE_LEFT = 2 };

/* The group page: one per service group, written by scdd only. */
struct tpsched_group_page {
	uint64_t magic;
	uint32_t version;
	uint32_t max_message;
	_Atomic uint32_t closed;
	unsigned char pad0[0x40 - 0x14];
	_Atomic uint32_t reader_sleeping;
};

/* The most mailboxes page 0 holds before the out-call lines. */
#define TPSCHED_MAX_MAILBOXES 60
#define TPSCHED_OUT_CALL 0xF80 /* page 0's last two lines */
#define TPSCHED_OUT_NAMES 64   /* room the out buffer keeps for the names */

/* A mailbox: one call handed to a process (page 0, line 2 + i). scdd
 * writes the call's fields, the UAP the completion's. */
struct tpsched_mailbox {
	_Atomic uint64_t claim;
	int64_t deadline;
	uint32_t req_len;
	uint32_t entry_len;
	_Atomic uint32_t status;
	_Atomic uint32_t reply_len;
	unsigned char entry[TPSCHED_MAX_NAME];
};

/* The process's own call to another service (page 0, lines 62 and 63):
 * the first line the UAP writes, the second scdd (tpsched_call_service). */
struct tpsched_out_call {
	_Atomic uint64_t no;
	uint32_t timeout_ms;
	uint32_t group_len;
	uint32_t service_len;
	uint32_t req_len;
	_Atomic uint32_t sleeping;
	unsigned char pad0[0x40 - 0x1C];
	_Atomic uint64_t done;
	_Atomic uint32_t code;
	_Atomic uint32_t reply_len;
	_Atomic uint32_t wake;
	unsigned char pad1[0x40 - 0x14];
};

/* Page 0 of a process area: line 0 written by scdd, line 1 by the UAP,
 * then the mailboxes, then the out-call lines. */
struct tpsched_proc_ctl {
	uint64_t magic;
	uint32_t version;
	uint32_t max_message;
	_Atomic uint32_t wake;
	_Atomic uint32_t stop;
	_Atomic uint64_t dispatch_no;
	uint32_t mailboxes;
	/* Lanes (docs/SHM.md, "Lanes"): the generation of the lane the
	 * process serves and of the one it calls on, written by scdd. */
	_Atomic uint32_t lane_in;
	_Atomic uint32_t lane_out;
	unsigned char pad0[0x40 - 0x2C];
	_Atomic uint32_t state;
	_Atomic uint32_t sleeping;
	_Atomic uint64_t done_no;
	_Atomic uint32_t pid;
	_Atomic uint32_t entries;
	_Atomic uint32_t lanes;
	_Atomic uint32_t lane_in_on;
	_Atomic uint32_t lane_out_on;
	unsigned char pad1[0x80 - 0x64];
	struct tpsched_mailbox mailbox[TPSCHED_MAX_MAILBOXES];
	struct tpsched_out_call out;
};

/* A lane (docs/SHM.md, "Lanes"): page 0 of the memfd scdd grants a caller
 * and a callee, then the buffer at TPSCHED_LANE_BUFFER. Line 0 is the
 * caller's, line 1 the callee's, line 2 the claim, lines 3 on scdd's. */
#define TPSCHED_LANE_MAGIC UINT64_C(0x454E414C48435054) /* "TPCHLANE" */
#define TPSCHED_LANE_BUFFER TPSCHED_PAGE_SIZE
#define TPSCHED_LANE_RULE_MAX 256
struct tpsched_lane {
	_Atomic uint64_t seq;
	_Atomic int64_t deadline;
	_Atomic uint32_t req_len;
	_Atomic uint32_t caller_sleeping;
	_Atomic uint32_t callee_wake;
	unsigned char pad0[0x40 - 0x1C];
	_Atomic uint32_t callee_sleeping;
	_Atomic uint32_t status;
	_Atomic uint32_t reply_len;
	_Atomic uint32_t caller_wake;
	unsigned char pad1[0x80 - 0x50];
	_Atomic uint64_t claim;
	unsigned char pad2[0xC0 - 0x88];
	uint64_t magic;
	uint32_t version;
	uint32_t gen;
	uint32_t max_message;
	_Atomic uint32_t rule_len;
	unsigned char pad3[0x100 - 0xD8];
	unsigned char rule_text[TPSCHED_LANE_RULE_MAX];
};

/* The size of each buffer for max_message_size m, of the out buffer, and
 * of a process area with k mailboxes. */
#define TPSCHED_BUF_STRIDE(m) (((uint64_t)(m) + TPSCHED_PAGE_SIZE - 1) / TPSCHED_PAGE_SIZE * TPSCHED_PAGE_SIZE)
#define TPSCHED_OUT_STRIDE(m) TPSCHED_BUF_STRIDE((uint64_t)(m) + TPSCHED_OUT_NAMES)
#define TPSCHED_AREA_SIZE(m, k) (TPSCHED_BUFFERS + (uint64_t)(k) * TPSCHED_BUF_STRIDE(m) + TPSCHED_OUT_STRIDE(m))
/* The size of a lane whose buffer holds max_message m. */
#define TPSCHED_LANE_SIZE(m) (TPSCHED_LANE_BUFFER + TPSCHED_BUF_STRIDE(m))
#endif /* !__cplusplus */

#endif /* TPSCHED_UAP_H */
