package bpf

// The eBPF objects, built by bpf2go with the pinned clang (`make generate`);
// the generated Go and .o files are committed so `go build` needs no clang,
// and `make check-generate` checks that they are what these lines make.

//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include" -target bpfel -type proc_stats sched sched.c
//go:generate go tool bpf2go -cc clang-16 -strip llvm-strip-16 -cflags "-O2 -g -Wall -Werror -I/usr/include" -target bpfel -type receiver_load steer steer.c
