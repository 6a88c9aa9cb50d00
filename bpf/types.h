/* The few kernel types the probes need, so building them needs neither
 * vmlinux.h nor the kernel's uapi headers. task_struct is declared with
 * preserve_access_index: libbpf-style CO-RE relocates the field offsets to
 * the running kernel's BTF at load time. */
#ifndef TPSCHED_TYPES_H
#define TPSCHED_TYPES_H

typedef unsigned char __u8;
typedef unsigned short __u16;
typedef unsigned int __u32;
typedef unsigned long long __u64;
typedef int __s32;
typedef long long __s64;
typedef __u16 __be16;
typedef __u32 __be32;
typedef __u32 __wsum;
typedef _Bool bool;

enum {
	BPF_MAP_TYPE_HASH = 1,
	BPF_MAP_TYPE_ARRAY = 2,
	BPF_MAP_TYPE_LRU_HASH = 9,
	BPF_MAP_TYPE_REUSEPORT_SOCKARRAY = 20,
};

enum {
	BPF_F_MMAPABLE = (1U << 10),
};

enum sk_action {
	SK_DROP = 0,
	SK_PASS = 1,
};

/* The SK_REUSEPORT program's context, as far as steer.c reads it: UAPI
 * (include/uapi/linux/bpf.h), fixed offsets, no CO-RE. */
struct sk_reuseport_md {
	union {
		void *data;
		__u64 data_u64;
	};
	union {
		void *data_end;
		__u64 data_end_u64;
	};
	__u32 len;
	__u32 eth_protocol;
	__u32 ip_protocol;
	__u32 bind_inany;
	__u32 hash;
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
};

struct rq {
	unsigned int nr_running;
	int cpu;
} __attribute__((preserve_access_index));

struct cfs_rq {
	struct rq *rq;
} __attribute__((preserve_access_index));

struct sched_entity {
	__u64 sum_exec_runtime;
	struct cfs_rq *cfs_rq;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct sched_entity se;
} __attribute__((preserve_access_index));

#endif
