// Package bpf owns the node's eBPF programs and what they measure: for each
// UAP process procmgr runs, its on-CPU time and how long its threads waited
// on a run queue, with the waits as a log2 histogram. Those are the figures
// only the kernel has; exact request counts come from the queue counters.
//
// Nothing depends on eBPF loading. Open tries tp_btf, then raw_tp, then the
// classic tracepoint (mounting tracefs if it must), and otherwise returns a
// Meter that reads /proc; Mechanism says which one is live and why.
//
// sched.c is compiled by bpf2go with a pinned clang (`make generate`); the
// generated Go and .o files are committed so `go build` needs no clang.
package bpf
