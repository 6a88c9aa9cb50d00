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
	BPF_MAP_TYPE_LRU_HASH = 9,
};

enum {
	BPF_ANY = 0,
	BPF_NOEXIST = 1,
};

struct sched_entity {
	__u64 sum_exec_runtime;
} __attribute__((preserve_access_index));

struct task_struct {
	int pid;
	int tgid;
	struct sched_entity se;
} __attribute__((preserve_access_index));

#endif
