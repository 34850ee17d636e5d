/* Tries, from inside a sandbox, every system call that acts on another
 * process of the same user and could stop, starve or kill corral's agent
 * (PID 1) or trace a later command. Prints one line per attempt:
 * "<name> refused" or "<name> ALLOWED". Then forges an "outside" SIGTERM
 * to PID 1: it exhausts the user's pending-signal quota with queued
 * real-time signals to itself, so sigqueue() delivers SIGTERM without
 * sender details (pid 0, like the daemon's docker stop). */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ptrace.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

static void report(const char *name, long rc) {
    printf("%s %s\n", name, rc == 0 ? "ALLOWED" : "refused");
    fflush(stdout);
}

int main(void) {
    struct rlimit cur, low;
    getrlimit(RLIMIT_CPU, &cur);
    low.rlim_cur = 1; low.rlim_max = 1;
    report("prlimit-cpu", prlimit(1, RLIMIT_CPU, &low, NULL));
    /* The same through the x32 ABI (bit 30 of the number). */
    report("prlimit-x32", syscall(SYS_prlimit64 | 0x40000000, 1, RLIMIT_CPU, &low, NULL));
    low.rlim_cur = 0; low.rlim_max = 0;
    report("prlimit-sigpending", prlimit(1, RLIMIT_SIGPENDING, &low, NULL));
    struct sched_param sp = {0};
    report("sched-idle", sched_setscheduler(1, SCHED_IDLE, &sp));
    cpu_set_t set; CPU_ZERO(&set); CPU_SET(0, &set);
    report("sched-affinity", sched_setaffinity(1, sizeof set, &set));
    report("nice-pid1", setpriority(PRIO_PROCESS, 1, 19));
    report("nice-user", setpriority(PRIO_USER, 0, 19));
    report("ioprio-pid1", syscall(SYS_ioprio_set, 1, 1, (3 << 13) | 7));
    report("ptrace-seize", ptrace(PTRACE_SEIZE, 1, 0, 0));
    char buf[8]; struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
    report("process-vm-readv", process_vm_readv(1, &local, 1, &remote, 1, 0) < 0 ? -1 : 0);
    /* Allowed on oneself. */
    report("nice-self", setpriority(PRIO_PROCESS, 0, 1));
    /* The default policy on one's own thread by its tid, as ZeroMQ does. */
    report("sched-other-own-tid", sched_setscheduler(syscall(SYS_gettid), SCHED_OTHER, &sp));

    /* The forged outside SIGTERM. */
    sigset_t rt; sigemptyset(&rt); sigaddset(&rt, SIGRTMIN);
    sigprocmask(SIG_BLOCK, &rt, NULL);
    union sigval v = {0};
    long queued = 0;
    while (queued < 10000000 && sigqueue(getpid(), SIGRTMIN, v) == 0) queued++;
    signal(SIGTERM, SIG_IGN);
    int rc = sigqueue(1, SIGTERM, v);
    printf("forged-sigterm sent=%d after %ld queued\n", rc == 0, queued);
    return 1;
}
