/*
 * wakepairs PAIRS SECS PROCS: PAIRS pairs of processes that pass a turn back
 * and forth through a futex word for SECS seconds, as a lane's caller and
 * callee do (docs/ARCHITECTURE.md "Lanes"), each pair's processes joining
 * the cgroup whose cgroup.procs file is PROCS ("-": they stay where they
 * are). Beside them the parent, where it was started, sleeps 20 ms at a
 * time and prints how late its latest wake-up came at worst, and the turns
 * the pairs made.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static long long now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return t.tv_sec * 1000000000LL + t.tv_nsec;
}

/* pass waits for the turn to be side's, then gives it to the other side. */
static void pass(_Atomic unsigned *turn, unsigned side)
{
	unsigned v;
	while ((v = atomic_load(turn)) != side)
		syscall(SYS_futex, turn, FUTEX_WAIT, v, NULL, NULL, 0);
	atomic_store(turn, 1 - side);
	syscall(SYS_futex, turn, FUTEX_WAKE, 1, NULL, NULL, 0);
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: wakepairs PAIRS SECS PROCS|-\n");
		return 2;
	}
	int pairs = atoi(argv[1]);
	long long secs = atoll(argv[2]), end = now() + secs * 1000000000LL;
	const char *procs = argv[3];
	/* A turn word per pair, a cache line apart; then the turns made. */
	_Atomic unsigned *turns = mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	_Atomic long *made = (_Atomic long *)(turns + 512);
	long long last = now(); /* the sleeper's last look, from before the forks: it may get no CPU after them */
	for (int p = 0; p < pairs; p++) {
		for (unsigned side = 0; side < 2; side++) {
			if (fork() != 0)
				continue;
			if (strcmp(procs, "-") != 0) {
				FILE *f = fopen(procs, "w");
				if (f == NULL || fprintf(f, "%d\n", getpid()) < 0 || fclose(f) != 0) {
					perror(procs);
					_exit(1);
				}
			}
			_Atomic unsigned *turn = &turns[p * 16];
			long n = 0;
			while (now() < end) {
				pass(turn, side);
				n++;
			}
			atomic_store(turn, 1 - side); /* the other side's last wait ends */
			syscall(SYS_futex, turn, FUTEX_WAKE, 1, NULL, NULL, 0);
			atomic_fetch_add(made, n);
			_exit(0);
		}
	}
	long long worst = 0;
	int sleeps = 0;
	do {
		struct timespec d = {0, 20000000};
		nanosleep(&d, NULL);
		long long t = now(), late = t - last - 20000000;
		if (late > worst)
			worst = late;
		last = t;
		sleeps++;
	} while (last < end);
	while (wait(NULL) > 0)
		;
	printf("%d pairs, %s: %lld turns/s; beside them %d sleeps of 20 ms, the latest %.1f ms late\n", pairs,
	       strcmp(procs, "-") == 0 ? "where they were started" : procs, (long long)atomic_load(made) / 2 / secs, sleeps, worst / 1e6);
	return 0;
}
