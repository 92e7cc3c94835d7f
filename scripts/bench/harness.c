/*
 * harness.c -- whole-process wall-clock timer for scripts/bench-peers.
 *
 * Runs a command N times, one after the other, and prints one sample per line: the
 * nanoseconds from just before fork() to just after waitpid() returned, measured with
 * clock_gettime(CLOCK_MONOTONIC). The child's stdin, stdout and stderr are /dev/null, so
 * neither terminal output nor a pipe reader's speed is part of what is measured, and the
 * driver's own (Python) overhead is outside the timed region.
 *
 *   harness [-n ITERATIONS] [-t TIMEOUT_SECONDS] [-o FILE] -- COMMAND [ARG...]
 *
 * Every iteration must exit with status 0. On the first one that does not (non-zero exit,
 * killed by a signal, exec failure = 127, or over the timeout, in which case the child is
 * sent SIGKILL by its pid), the harness stops, prints the reason on stderr and exits 1.
 * The samples taken so far are still printed. Exit 2 means a usage or system error.
 *
 * Built by scripts/bench-peers with `gcc -O2`; standard C and POSIX only.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t timed_out;

static void on_alarm(int sig) {
    (void)sig;
    timed_out = 1;
}

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void usage(void) {
    fprintf(stderr, "usage: harness [-n ITERATIONS] [-t TIMEOUT_SECONDS] [-o FILE] -- COMMAND [ARG...]\n");
    exit(2);
}

int main(int argc, char **argv) {
    long iterations = 1;
    unsigned timeout_s = 60;
    const char *out_path = NULL;
    int opt;
    while ((opt = getopt(argc, argv, "+n:t:o:")) != -1) {
        switch (opt) {
        case 'n': iterations = strtol(optarg, NULL, 10); break;
        case 't': timeout_s = (unsigned)strtoul(optarg, NULL, 10); break;
        case 'o': out_path = optarg; break;
        default: usage();
        }
    }
    if (optind >= argc || iterations < 1) usage();
    char **cmd = argv + optind;

    FILE *out = stdout;
    if (out_path && !(out = fopen(out_path, "w"))) {
        fprintf(stderr, "harness: %s: %s\n", out_path, strerror(errno));
        return 2;
    }
    int devnull = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (devnull < 0) {
        perror("harness: /dev/null");
        return 2;
    }
    /* SIGALRM interrupts waitpid (no SA_RESTART) so that a hung child can be killed. */
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_alarm;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGALRM, &sa, NULL);

    int64_t *samples = calloc((size_t)iterations, sizeof *samples);
    if (!samples) {
        perror("harness: calloc");
        return 2;
    }
    int rc = 0;
    long done = 0;
    for (long i = 0; i < iterations; i++) {
        int64_t t0 = now_ns();
        pid_t pid = fork();
        if (pid < 0) {
            perror("harness: fork");
            rc = 2;
            break;
        }
        if (pid == 0) {
            dup2(devnull, 0);
            dup2(devnull, 1);
            dup2(devnull, 2);
            execvp(cmd[0], cmd);
            _exit(127);
        }
        int status;
        timed_out = 0;
        alarm(timeout_s);
        pid_t w;
        while ((w = waitpid(pid, &status, 0)) < 0 && errno == EINTR) {
            if (timed_out) {
                kill(pid, SIGKILL); /* by pid: only the child this harness started */
                timed_out = 0;
                alarm(0);
                fprintf(stderr, "harness: iteration %ld: still running after %us, killed\n", i, timeout_s);
                rc = 1;
            }
        }
        int64_t t1 = now_ns();
        alarm(0);
        if (w < 0) {
            perror("harness: waitpid");
            rc = 2;
            break;
        }
        if (rc) break;
        if (WIFEXITED(status) && WEXITSTATUS(status) != 0) {
            fprintf(stderr, "harness: iteration %ld: exit status %d\n", i, WEXITSTATUS(status));
            rc = 1;
            break;
        }
        if (WIFSIGNALED(status)) {
            fprintf(stderr, "harness: iteration %ld: killed by signal %d (%s)\n", i, WTERMSIG(status),
                    strsignal(WTERMSIG(status)));
            rc = 1;
            break;
        }
        samples[done++] = t1 - t0;
    }
    for (long i = 0; i < done; i++) fprintf(out, "%lld\n", (long long)samples[i]);
    if (fclose(out) != 0) {
        perror("harness: write");
        return 2;
    }
    return rc;
}
