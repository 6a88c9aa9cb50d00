//go:build ignore

// SPDX-License-Identifier: (GPL-2.0-only OR BSD-2-Clause)
/*
 * Per-process on-CPU time and run-queue wait for the UAP processes procmgr
 * runs. procmgr puts each process id (tgid) in `procs`; these programs fill
 * in its counters from sched_wakeup and sched_switch.
 *
 * Threads are known by tid in `threads`. A thread enters it the first time
 * it is seen with its tgid: at wake-up or switch-in when the program can
 * read the task (tp_btf, raw_tp), or at switch-out, when it is `current`
 * (any attach type). On-CPU time is the kernel's own sum_exec_runtime of
 * the thread, taken at each switch-out, so a thread that was already
 * running when it was first seen loses nothing. The classic tracepoint
 * gives only tids, so there a thread's first run-queue wait may go
 * uncounted.
 *
 * A thread's entry goes when its task is freed (sched_process_free, after
 * its last switch-out), so the map holds live threads only. It held ended
 * threads' until the LRU evicted them, and with a pid_max above its size
 * (systemd's 4194304) a long-idle live thread's entry went too: seen again,
 * the thread counted from 0, and all it had run was added a second time.
 * An entry found with another tgid (its thread's free not seen yet) is an
 * ended thread's whose id was reused, and is replaced.
 *
 * The same three handlers serve each attach type; only how the arguments
 * are read differs. All of them need kernel BTF (CO-RE reads the task);
 * without it the Go side falls back to /proc. The free handler is a raw_tp
 * for all three (sched_process_free's record layout differs between
 * kernels, and it runs after the task is gone from `current`).
 *
 * `runqueue` holds, per CPU, how many tasks its run queue held at the last
 * switch on it or wake-up onto it (rq->nr_running, the one running
 * included). scdd's reader reads it, mapped, to spin only while no task
 * waits for a CPU. The classic tracepoint gives no task pointer, so there
 * it stays empty and the reader does without.
 */
#include "types.h"
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_core_read.h>
#include <bpf/bpf_tracing.h>

char LICENSE[] SEC("license") = "Dual BSD/GPL";

#define HIST_SLOTS 28 /* slot i counts waits in [2^i, 2^(i+1)) us; slot 0 also < 1 us */
#define TASK_RUNNING 0
#define TASK_REPORT_MAX 0x100 /* the tracepoint's prev_state for a preempted task */

struct proc_stats {
	__u64 oncpu_ns;
	__u64 wait_ns;
	__u64 waits;
	__u64 hist[HIST_SLOTS];
};

struct thread_state {
	__u32 tgid;
	__u32 pad;
	__u64 runtime_seen; /* sum_exec_runtime already added to its process */
	__u64 queued_since; /* made runnable at; 0: not waiting */
};

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, 8192);
	__type(key, __u32);
	__type(value, struct proc_stats);
} procs SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, 65536);
	__type(key, __u32);
	__type(value, struct thread_state);
} threads SEC(".maps");

#define MAX_CPUS 1024 /* the runqueue map's size: one page of counts */

struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(map_flags, BPF_F_MMAPABLE);
	__uint(max_entries, MAX_CPUS);
	__type(key, __u32);
	__type(value, __u32);
} runqueue SEC(".maps");

/* note_runqueue stores the length of t's run queue under its CPU. A task
 * whose sched_entity has no cfs_rq (none does without group scheduling)
 * tells nothing. */
static __always_inline void note_runqueue(struct task_struct *t)
{
	struct rq *rq = BPF_CORE_READ(t, se.cfs_rq, rq);
	if (!rq)
		return;
	__u32 cpu = BPF_CORE_READ(rq, cpu);
	__u32 *n = bpf_map_lookup_elem(&runqueue, &cpu);
	if (n)
		*n = BPF_CORE_READ(rq, nr_running);
}

/* note_idle says this CPU runs nothing now. */
static __always_inline void note_idle(void)
{
	__u32 cpu = bpf_get_smp_processor_id();
	__u32 *n = bpf_map_lookup_elem(&runqueue, &cpu);
	if (n)
		*n = 0;
}

static __always_inline __u32 log2_slot(__u64 v)
{
	__u32 r = 0;
	if (v >= (1ULL << 16)) { v >>= 16; r += 16; }
	if (v >= (1ULL << 8)) { v >>= 8; r += 8; }
	if (v >= (1ULL << 4)) { v >>= 4; r += 4; }
	if (v >= (1ULL << 2)) { v >>= 2; r += 2; }
	if (v >= (1ULL << 1)) { r += 1; }
	return r < HIST_SLOTS ? r : HIST_SLOTS - 1;
}

/* thread finds tid's state; with tgid != 0 it creates it when the process
 * is tracked. An entry of another process is an ended thread's whose id
 * was reused before its free was seen: it is dropped, not taken, or the
 * new thread's time would go to the ended process. */
static __always_inline struct thread_state *thread(__u32 tid, __u32 tgid)
{
	struct thread_state *t = bpf_map_lookup_elem(&threads, &tid);
	if (t && tgid != 0 && t->tgid != tgid) {
		bpf_map_delete_elem(&threads, &tid);
		t = NULL;
	}
	if (t || tgid == 0 || !bpf_map_lookup_elem(&procs, &tgid))
		return t;
	struct thread_state fresh = { .tgid = tgid };
	bpf_map_update_elem(&threads, &tid, &fresh, BPF_NOEXIST);
	return bpf_map_lookup_elem(&threads, &tid);
}

static __always_inline void on_wakeup(__u32 tid, __u32 tgid)
{
	struct thread_state *t = thread(tid, tgid);
	if (t && t->queued_since == 0)
		t->queued_since = bpf_ktime_get_ns();
}

static __always_inline void on_switch(__u32 prev_tid, int prev_runnable, __u32 next_tid, __u32 next_tgid)
{
	__u64 now = bpf_ktime_get_ns();
	/* The tracepoint runs before the switch: current is still prev. */
	struct thread_state *t = thread(prev_tid, bpf_get_current_pid_tgid() >> 32);
	if (t) {
		struct task_struct *prev = (struct task_struct *)bpf_get_current_task();
		__u64 runtime = BPF_CORE_READ(prev, se.sum_exec_runtime);
		struct proc_stats *st = bpf_map_lookup_elem(&procs, &t->tgid);
		if (st && runtime > t->runtime_seen)
			__sync_fetch_and_add(&st->oncpu_ns, runtime - t->runtime_seen);
		t->runtime_seen = runtime;
		t->queued_since = prev_runnable ? now : 0;
	}
	t = thread(next_tid, next_tgid);
	if (!t || t->queued_since == 0)
		return;
	__u64 waited = now - t->queued_since;
	t->queued_since = 0;
	struct proc_stats *st = bpf_map_lookup_elem(&procs, &t->tgid);
	if (!st)
		return;
	__sync_fetch_and_add(&st->wait_ns, waited);
	__sync_fetch_and_add(&st->waits, 1);
	__sync_fetch_and_add(&st->hist[log2_slot(waited / 1000)], 1);
}

/* on_free drops a freed thread's entry: its last switch-out has been
 * counted (the scheduler lets go of a dead task after it, and the free
 * comes a grace period later). An entry of another process is a new
 * thread's that took the id meanwhile. */
static __always_inline void on_free(__u32 tid, __u32 tgid)
{
	struct thread_state *t = bpf_map_lookup_elem(&threads, &tid);
	if (t && t->tgid == tgid)
		bpf_map_delete_elem(&threads, &tid);
}

SEC("raw_tp/sched_process_free")
int BPF_PROG(raw_free, struct task_struct *p)
{
	on_free(BPF_CORE_READ(p, pid), BPF_CORE_READ(p, tgid));
	return 0;
}

/* tp_btf: typed arguments, no tracefs. */

SEC("tp_btf/sched_switch")
int BPF_PROG(btf_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	on_switch(prev->pid, preempt || prev_state == TASK_RUNNING, next->pid, next->tgid);
	if (next->pid == 0)
		note_idle();
	else
		note_runqueue(next);
	return 0;
}

SEC("tp_btf/sched_wakeup")
int BPF_PROG(btf_wakeup, struct task_struct *p)
{
	on_wakeup(p->pid, p->tgid);
	note_runqueue(p);
	return 0;
}

SEC("tp_btf/sched_wakeup_new")
int BPF_PROG(btf_wakeup_new, struct task_struct *p)
{
	on_wakeup(p->pid, p->tgid);
	return 0;
}

/* raw_tp: the same arguments as u64s, read with CO-RE; no tracefs. */

SEC("raw_tp/sched_switch")
int BPF_PROG(raw_switch, bool preempt, struct task_struct *prev, struct task_struct *next, unsigned int prev_state)
{
	__u32 next_pid = BPF_CORE_READ(next, pid);
	on_switch(BPF_CORE_READ(prev, pid), preempt || prev_state == TASK_RUNNING,
		  next_pid, BPF_CORE_READ(next, tgid));
	if (next_pid == 0)
		note_idle();
	else
		note_runqueue(next);
	return 0;
}

SEC("raw_tp/sched_wakeup")
int BPF_PROG(raw_wakeup, struct task_struct *p)
{
	on_wakeup(BPF_CORE_READ(p, pid), BPF_CORE_READ(p, tgid));
	note_runqueue(p);
	return 0;
}

SEC("raw_tp/sched_wakeup_new")
int BPF_PROG(raw_wakeup_new, struct task_struct *p)
{
	on_wakeup(BPF_CORE_READ(p, pid), BPF_CORE_READ(p, tgid));
	return 0;
}

/* The classic tracepoint: fixed record layouts from tracefs' format files,
 * tids only. */

struct switch_record {
	__u64 common;
	char prev_comm[16];
	int prev_pid;
	int prev_prio;
	long prev_state;
	char next_comm[16];
	int next_pid;
	int next_prio;
};

struct wakeup_record {
	__u64 common;
	char comm[16];
	int pid;
	int prio;
	int target_cpu;
};

SEC("tracepoint/sched/sched_switch")
int tp_switch(struct switch_record *r)
{
	on_switch(r->prev_pid, (r->prev_state & (TASK_REPORT_MAX - 1)) == 0, r->next_pid, 0);
	return 0;
}

SEC("tracepoint/sched/sched_wakeup")
int tp_wakeup(struct wakeup_record *r)
{
	on_wakeup(r->pid, 0);
	return 0;
}

SEC("tracepoint/sched/sched_wakeup_new")
int tp_wakeup_new(struct wakeup_record *r)
{
	on_wakeup(r->pid, 0);
	return 0;
}
