/* Attack helper of agent_port.rs, run inside a sandbox: holds N idle TCP
 * connections from SRC (an address of the pod, or "-" for the kernel's
 * choice) to DST:PORT, dialling again whenever the peer closes one, until
 * killed. Prints "holding N" once the first N are open. busybox nc cannot
 * choose its source address, hence this. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *src, *dst;
static int port;

static int dial(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0)
        return -1;
    if (strcmp(src, "-") != 0) {
        struct sockaddr_in a = {0};
        a.sin_family = AF_INET;
        if (inet_pton(AF_INET, src, &a.sin_addr) != 1 ||
            bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
            perror("bind");
            exit(2);
        }
    }
    struct sockaddr_in d = {0};
    d.sin_family = AF_INET;
    d.sin_port = htons(port);
    if (inet_pton(AF_INET, dst, &d.sin_addr) != 1) {
        fprintf(stderr, "bad address %s\n", dst);
        exit(2);
    }
    if (connect(fd, (struct sockaddr *)&d, sizeof d) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

int main(int argc, char **argv) {
    if (argc != 5) {
        fprintf(stderr, "usage: hold SRC|- DST PORT N\n");
        return 2;
    }
    src = argv[1];
    dst = argv[2];
    port = atoi(argv[3]);
    int n = atoi(argv[4]);
    struct pollfd *fds = calloc(n, sizeof *fds);
    if (!fds)
        return 1;
    for (int i = 0; i < n; i++) {
        fds[i].fd = dial();
        if (fds[i].fd < 0) {
            perror("connect");
            return 1;
        }
        fds[i].events = POLLIN;
    }
    printf("holding %d\n", n);
    fflush(stdout);
    for (;;) {
        if (poll(fds, n, 1000) < 0)
            continue;
        for (int i = 0; i < n; i++) {
            char buf[256];
            if (fds[i].fd >= 0 && !fds[i].revents)
                continue;
            if (fds[i].fd >= 0 && read(fds[i].fd, buf, sizeof buf) > 0)
                continue;
            if (fds[i].fd >= 0)
                close(fds[i].fd);
            /* Not a busy loop when the agent closes at once. */
            usleep(20000);
            fds[i].fd = dial();
        }
    }
}
