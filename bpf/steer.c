//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Steering of one receiver group's new connections (SK_REUSEPORT). The
 * group's listening sockets share a port with SO_REUSEPORT; the kernel runs
 * this program for each new connection (at the SYN) and it picks the
 * receiver with the least work: the fewest calls in flight plus
 * connections open plus one per 4 KiB read per second lately (a receiver
 * reading large calls is busy even when it holds few of them), which the
 * receivers' event loops keep in `load`, an
 * array the Go side maps into its memory and updates with plain atomic
 * adds (no syscall per call). Ties go to the first from a place the
 * connection's hash chooses, so idle receivers share new connections.
 *
 * If the chosen socket cannot take it (not in `receivers`), the program
 * returns SK_PASS without a choice and the kernel's hash decides, as it
 * does when no program is attached.
 */
#include "types.h"
#include <bpf/bpf_helpers.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define MAX_RECEIVERS 256 /* netio's limit on receiving sockets */

struct receiver_load {
	__s64 in_flight; /* calls read and not yet answered */
	__s64 conns;     /* connections open */
	__s64 read_rate; /* bytes read per second, lately */
};

struct {
	__uint(type, BPF_MAP_TYPE_REUSEPORT_SOCKARRAY);
	__uint(max_entries, MAX_RECEIVERS);
	__type(key, __u32);
	__type(value, __u64);
} receivers SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, MAX_RECEIVERS);
	__uint(map_flags, BPF_F_MMAPABLE);
	__type(key, __u32);
	__type(value, struct receiver_load);
} load SEC(".maps");

/* decisions[0]: connections steered; [1]: left to the hash (no socket at
 * the chosen index). */
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 2);
	__type(key, __u32);
	__type(value, __u64);
} decisions SEC(".maps");

/* The group's receivers, set before the program is loaded. */
volatile const __u32 n_receivers = 1;

static __always_inline void count(__u32 what)
{
	__u64 *c = bpf_map_lookup_elem(&decisions, &what);
	if (c)
		__sync_fetch_and_add(c, 1);
}

SEC("sk_reuseport")
int steer(struct sk_reuseport_md *ctx)
{
	__u32 n = n_receivers;
	__u32 start, best, i;
	__s64 best_work = 0x7fffffffffffffffLL;

	if (n == 0 || n > MAX_RECEIVERS)
		return SK_PASS;
	start = ctx->hash % n;
	best = start;
	for (i = 0; i < MAX_RECEIVERS; i++) {
		__u32 k;
		__s64 in_flight, conns, rate, work;
		struct receiver_load *l;

		if (i >= n)
			break;
		k = start + i;
		if (k >= n)
			k -= n;
		l = bpf_map_lookup_elem(&load, &k);
		if (!l)
			continue;
		in_flight = l->in_flight;
		conns = l->conns;
		rate = l->read_rate;
		work = (in_flight > 0 ? in_flight : 0) + (conns > 0 ? conns : 0) + (rate > 0 ? rate >> 12 : 0);
		if (work < best_work) {
			best_work = work;
			best = k;
		}
	}
	if (bpf_sk_select_reuseport(ctx, &receivers, &best, 0) == 0)
		count(0);
	else
		count(1);
	return SK_PASS;
}
