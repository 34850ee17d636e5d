/* Tries what a sandbox started for in-place reset must still refuse to a
 * command: namespaces (which hand out capabilities), mounts, chroot,
 * joining PID 1's mount namespace, and the other calls Docker's seccomp
 * profile opens along with CAP_SYS_ADMIN. Prints one line per attempt,
 * "NAME ok" or "NAME refused ERRNO"; `ipc` makes System V objects and
 * prints their ids; `ipc-count` prints how many exist. Built static by the
 * tests. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <linux/perf_event.h>
#include <sys/mount.h>
#include <sys/ptrace.h>
#include <sys/uio.h>
#include <sys/msg.h>
#include <sys/shm.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <linux/sched.h>

static void report(const char *name, long ret) {
    if (ret < 0)
        printf("%s refused %d\n", name, errno);
    else
        printf("%s ok\n", name);
    fflush(stdout);
}

static long try_clone(unsigned long flags) {
    long pid = syscall(SYS_clone, flags | SIGCHLD, 0, 0, 0, 0);
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, 0, 0);
    return pid;
}

static long try_clone3(unsigned long flags) {
    struct clone_args args;
    memset(&args, 0, sizeof args);
    args.flags = flags;
    args.exit_signal = SIGCHLD;
    long pid = syscall(SYS_clone3, &args, sizeof args);
    if (pid == 0)
        _exit(0);
    if (pid > 0)
        waitpid(pid, 0, 0);
    return pid;
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "ipc") == 0) {
        int shm = shmget(IPC_PRIVATE, 4096, IPC_CREAT | 0600);
        int msg = msgget(IPC_PRIVATE, IPC_CREAT | 0600);
        printf("shm %d msg %d\n", shm, msg);
        return shm < 0 || msg < 0;
    }
    if (argc > 1 && strcmp(argv[1], "ipc-count") == 0) {
        const char *files[] = {"/proc/sysvipc/shm", "/proc/sysvipc/msg"};
        int n = 0;
        for (int i = 0; i < 2; i++) {
            FILE *f = fopen(files[i], "r");
            char line[512];
            if (!f)
                continue;
            if (fgets(line, sizeof line, f))
                while (fgets(line, sizeof line, f))
                    n++;
            fclose(f);
        }
        printf("%d\n", n);
        return 0;
    }
    report("unshare-user", unshare(CLONE_NEWUSER));
    report("unshare-mount", unshare(CLONE_NEWNS));
    report("clone-user", try_clone(CLONE_NEWUSER));
    report("clone-mount", try_clone(CLONE_NEWNS));
    report("clone3-user", try_clone3(CLONE_NEWUSER));
    report("mount-tmpfs", mount("x", "/tmp", "tmpfs", 0, 0));
    report("umount-proc", umount2("/proc", MNT_DETACH));
    report("chroot", chroot("/tmp"));
    int ns = open("/proc/1/ns/mnt", O_RDONLY);
    report("open-pid1-mntns", ns);
    report("setns-pid1", ns < 0 ? -1 : setns(ns, CLONE_NEWNS));
    report("open-pid1-root", open("/proc/1/root/", O_RDONLY | O_DIRECTORY));
    report("fsopen", syscall(SYS_fsopen, "tmpfs", 0));
    report("open-tree", syscall(SYS_open_tree, AT_FDCWD, "/", 1 /* OPEN_TREE_CLONE */));
    report("sethostname", sethostname("x", 1));
    report("ptrace-attach-pid1", ptrace(PTRACE_ATTACH, 1, 0, 0));
    char buf[8];
    struct iovec local = {buf, sizeof buf}, remote = {(void *)0x400000, sizeof buf};
    report("process-vm-readv-pid1", process_vm_readv(1, &local, 1, &remote, 1, 0));
    struct perf_event_attr pe;
    memset(&pe, 0, sizeof pe);
    pe.size = sizeof pe;
    pe.type = PERF_TYPE_SOFTWARE;
    pe.config = PERF_COUNT_SW_CPU_CLOCK;
    report("perf-event-open", syscall(SYS_perf_event_open, &pe, 1, -1, -1, 0));
    unsigned int attr[32];
    memset(attr, 0, sizeof attr);
    attr[0] = 2; /* BPF_MAP_TYPE_ARRAY */
    attr[1] = 4; /* key size */
    attr[2] = 4; /* value size */
    attr[3] = 1; /* entries */
    report("bpf-map-create", syscall(SYS_bpf, 0 /* BPF_MAP_CREATE */, attr, sizeof attr));
    report("open-pid1-mem", open("/proc/1/mem", O_RDONLY));
    return 0;
}
