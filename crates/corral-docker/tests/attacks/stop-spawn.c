/* A leftover process that SIGSTOPs the next process PID 1 forks, hoping
 * to catch it between fork and exec (still named "corral-agent"), which
 * would hold the agent's spawn, and with it the agent, forever. Logs
 * "HOLDING <pid>" for each child it caught before exec; runs for 30 s. */
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static int last_pid(void) {
    char b[32] = {0};
    int f = open("/proc/sys/kernel/ns_last_pid", O_RDONLY);
    if (f < 0) return 0;
    read(f, b, sizeof b - 1);
    close(f);
    return atoi(b);
}

static void comm(int pid, char *out, size_t len) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/comm", pid);
    int f = open(path, O_RDONLY);
    out[0] = 0;
    if (f < 0) return;
    int n = read(f, out, len - 1);
    close(f);
    out[n > 0 ? n : 0] = 0;
    if (n > 0 && out[n - 1] == '\n') out[n - 1] = 0;
}

int main(void) {
    time_t end = time(NULL) + 30;
    setvbuf(stdout, NULL, _IONBF, 0);
    while (time(NULL) < end) {
        int target = last_pid() + 1;
        while (kill(target, SIGSTOP) != 0) {
            if (time(NULL) >= end) return 0;
            int now = last_pid();
            if (now >= target) target = now + 1;
        }
        usleep(50000);
        char c[64];
        comm(target, c, sizeof c);
        if (strcmp(c, "corral-agent") == 0) {
            printf("HOLDING %d\n", target);
        } else {
            kill(target, SIGCONT);
        }
    }
    return 0;
}
