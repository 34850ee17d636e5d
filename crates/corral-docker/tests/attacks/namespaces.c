/* Tries to leave the sandbox's process limit through a namespace of its
 * own: inside a new user namespace a process holds every capability, and
 * gVisor does not apply RLIMIT_NPROC to a process with CAP_SYS_ADMIN, so
 * forks there go past the limit (each costing gVisor host tasks).
 *
 * Usage: namespaces MAX. Prints one line per attempt:
 *   unshare-user refused ERRNO | unshare-user ALLOWED forks=N
 *   setns-user refused ERRNO   | setns-user ALLOWED
 *   clone-user-pid refused ERRNO | clone-user-pid ALLOWED forks=N
 *   clone3-user-pid refused ERRNO | clone3-user-pid ALLOWED forks=N
 * then what must still work under the filter:
 *   fork ok | fork FAILED ERRNO;  thread ok | thread FAILED ERRNO
 *   forks N (outside any new namespace, up to MAX)
 * where forks=N is how many processes it held at once, up to MAX. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef SYS_clone3
#define SYS_clone3 435
#endif

struct clone_args_v0 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
};

static int max_forks;

/* Forks children that sleep until killed, up to max_forks or the first
 * refusal; kills and reaps them; returns how many were alive at once. */
static int fork_many(void) {
    pid_t *pids = calloc(max_forks, sizeof *pids);
    int n = 0;
    for (; n < max_forks; n++) {
        pid_t p = fork();
        if (p == 0) {
            for (;;) pause();
        }
        if (p < 0) break;
        pids[n] = p;
    }
    for (int i = 0; i < n; i++) kill(pids[i], SIGKILL);
    for (int i = 0; i < n; i++) waitpid(pids[i], NULL, 0);
    free(pids);
    return n;
}

/* The child of a namespace-creating clone: reports its forks through its
 * exit status. */
static void in_new_namespace(void) {
    int n = fork_many();
    _exit(n > 250 ? 250 : n);
}

static void report_child(const char *what, long r) {
    if (r < 0) {
        printf("%s refused %s\n", what, strerrorname_np(errno) ? strerrorname_np(errno) : "?");
        return;
    }
    if (r == 0) in_new_namespace();
    int status = 0;
    waitpid((pid_t)r, &status, __WALL);
    printf("%s ALLOWED forks=%d\n", what, WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

static void *thread_main(void *arg) { return arg; }

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    max_forks = argc > 1 ? atoi(argv[1]) : 128;

    /* unshare in a child, so this process keeps its own namespaces. */
    pid_t p = fork();
    if (p == 0) {
        if (unshare(CLONE_NEWUSER) != 0) {
            printf("unshare-user refused %s\n", strerrorname_np(errno));
            _exit(0);
        }
        printf("unshare-user ALLOWED forks=%d\n", fork_many());
        _exit(0);
    }
    waitpid(p, NULL, 0);

    int fd = open("/proc/self/ns/user", O_RDONLY);
    if (setns(fd, CLONE_NEWUSER) != 0)
        printf("setns-user refused %s\n", strerrorname_np(errno));
    else
        printf("setns-user ALLOWED\n");
    close(fd);

    /* Raw clone, no new stack: the child runs on a copy of this one. */
    report_child("clone-user-pid",
                 syscall(SYS_clone, CLONE_NEWUSER | CLONE_NEWPID | SIGCHLD, 0, 0, 0, 0));

    struct clone_args_v0 args = {0};
    args.flags = CLONE_NEWUSER | CLONE_NEWPID;
    args.exit_signal = SIGCHLD;
    report_child("clone3-user-pid", syscall(SYS_clone3, &args, sizeof args));

    /* What programs need still works: fork (glibc's goes through clone)
     * and threads (glibc tries clone3 first, then falls back to clone). */
    p = fork();
    if (p == 0) _exit(7);
    int status = 0;
    if (p > 0 && waitpid(p, &status, 0) == p && WIFEXITED(status) && WEXITSTATUS(status) == 7)
        printf("fork ok\n");
    else
        printf("fork FAILED %s\n", strerrorname_np(errno));
    pthread_t t;
    int e = pthread_create(&t, NULL, thread_main, NULL);
    if (e == 0 && pthread_join(t, NULL) == 0)
        printf("thread ok\n");
    else
        printf("thread FAILED %s\n", strerrorname_np(e));

    printf("forks %d\n", fork_many());
    return 0;
}
