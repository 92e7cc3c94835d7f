/*
 * guest_echo.c -- the smallest framed-protocol guest (docs/protocol.md, version 1), used by
 * scripts/bench-peers for the "wfjail framed" row of the /bin/true-class benchmark.
 *
 * It reads HELLO and REQUEST from the read fd, answers HELLO(1), and returns the request
 * bytes unchanged as its RESULT, then exits 0. The fds come from WFJAIL_FDS ("3,4" when
 * unset). Any protocol problem: a message on stderr and exit 1 (after an ERROR frame where
 * that still makes sense). No threads, no subprocesses, no files: it runs under `default`.
 *
 * Frame: length:u32 little-endian (kind byte + payload), kind:u8, payload.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { HELLO = 0x01, REQUEST = 0x02, RESULT = 0x03, ERROR = 0x04 };
#define FRAME_CAP (16u * 1024u * 1024u)
#define VERSION 1

static int rfd = 3, wfd = 4;

/* 1: n bytes read; 0: clean end-of-file before the first byte; -1: truncated or error. */
static int read_full(void *buf, size_t n) {
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(rfd, (char *)buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return got == 0 ? 0 : -1;
        got += (size_t)r;
    }
    return 1;
}

static int write_full(const void *buf, size_t n) {
    size_t put = 0;
    while (put < n) {
        ssize_t r = write(wfd, (const char *)buf + put, n - put);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) return -1;
        put += (size_t)r;
    }
    return 0;
}

static int write_frame(uint8_t kind, const void *payload, uint32_t len) {
    uint32_t n = len + 1;
    uint8_t head[5] = {(uint8_t)n, (uint8_t)(n >> 8), (uint8_t)(n >> 16), (uint8_t)(n >> 24), kind};
    if (write_full(head, sizeof head) < 0) return -1;
    return len ? write_full(payload, len) : 0;
}

/* Reads one frame; the payload is malloc'd (NULL when empty). Returns 0 or -1. */
static int read_frame(uint8_t *kind, uint8_t **payload, uint32_t *len) {
    uint8_t head[5];
    if (read_full(head, 4) != 1) return -1; /* end-of-file here is premature too */
    uint32_t n = (uint32_t)head[0] | (uint32_t)head[1] << 8 | (uint32_t)head[2] << 16 | (uint32_t)head[3] << 24;
    if (n == 0 || n - 1 > FRAME_CAP) return -1; /* checked before allocating */
    if (read_full(head + 4, 1) != 1) return -1;
    *kind = head[4];
    *len = n - 1;
    *payload = NULL;
    if (*len) {
        if (!(*payload = malloc(*len))) return -1;
        if (read_full(*payload, *len) != 1) return -1;
    }
    return 0;
}

static int fail(const char *msg) {
    char json[256];
    int n = snprintf(json, sizeof json,
                     "{\"type\": \"wfjail.ProtocolError\", \"message\": \"%s\", \"traceback\": \"\"}", msg);
    write_frame(ERROR, json, (uint32_t)n);
    fprintf(stderr, "guest_echo: %s\n", msg);
    return 1;
}

int main(void) {
    const char *fds = getenv("WFJAIL_FDS");
    if (fds && sscanf(fds, "%d,%d", &rfd, &wfd) != 2) {
        fprintf(stderr, "guest_echo: bad WFJAIL_FDS=%s\n", fds);
        return 1;
    }
    uint8_t kind;
    uint8_t *payload;
    uint32_t len;

    if (read_frame(&kind, &payload, &len) < 0 || kind != HELLO) return fail("expected HELLO");
    if (len != 8 || memcmp(payload, "wfjail", 6) != 0) return fail("bad HELLO payload");
    unsigned offered = payload[6] | payload[7] << 8;
    if (offered < VERSION) return fail("supervisor speaks no version this guest knows");
    free(payload);

    uint8_t hello[8] = {'w', 'f', 'j', 'a', 'i', 'l', VERSION & 0xff, VERSION >> 8};
    if (write_frame(HELLO, hello, sizeof hello) < 0) {
        fprintf(stderr, "guest_echo: cannot write HELLO\n");
        return 1;
    }
    if (read_frame(&kind, &payload, &len) < 0 || kind != REQUEST) return fail("expected REQUEST");
    if (write_frame(RESULT, payload, len) < 0) {
        fprintf(stderr, "guest_echo: cannot write RESULT\n");
        return 1;
    }
    return 0;
}
