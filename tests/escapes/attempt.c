/* One escape attempt per run, for tests/suite/run/escapes.rs (the catalogue is catalogue.toml).
 *
 *   attempt NAME [ARGS...]
 *
 * Prints one line `result=TOKEN` and exits 0: TOKEN is the errno name of the call that
 * decides the attempt (EPERM, EACCES, ...), or `ok` when it succeeded. A process that is
 * killed prints nothing (the report names the signal). The test compiles this file once per
 * run with `cc`, statically, so that it needs no loader under `strict`.
 *
 * Everything here runs confined by wfjail. Each attempt is harmless if it were allowed
 * (NULL pointers, bounded loops, children that exit at once): a failing row must never
 * hurt the machine running the test.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <spawn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

static const char *errname(int e) {
    switch (e) {
#define E(x) case x: return #x;
        E(EPERM) E(ENOENT) E(ESRCH) E(EINTR) E(EIO) E(ENXIO) E(E2BIG) E(ENOEXEC) E(EBADF)
        E(ECHILD) E(EAGAIN) E(ENOMEM) E(EACCES) E(EFAULT) E(EBUSY) E(EEXIST) E(EXDEV)
        E(ENODEV) E(ENOTDIR) E(EISDIR) E(EINVAL) E(ENFILE) E(EMFILE) E(ENOTTY) E(EFBIG)
        E(ENOSPC) E(ESPIPE) E(EROFS) E(EMLINK) E(EPIPE) E(ERANGE) E(ENOSYS) E(ENOTEMPTY)
        E(ELOOP) E(ENODATA) E(EOPNOTSUPP) E(EAFNOSUPPORT) E(EPROTONOSUPPORT)
        E(ESOCKTNOSUPPORT) E(EPROTOTYPE) E(ENOTSOCK) E(EISCONN) E(ENOTCONN) E(EADDRINUSE)
        E(ECONNREFUSED) E(ENETUNREACH) E(EDESTADDRREQ) E(EALREADY) E(EINPROGRESS)
        E(EOVERFLOW) E(ETXTBSY) E(ENOKEY)
#undef E
    default: {
        static char buf[32];
        snprintf(buf, sizeof buf, "errno%d", e);
        return buf;
    }
    }
}

/* The outcome of one attempt: the return value of the deciding call (errno on -1). */
static int report(long r) {
    if (r == -1)
        printf("result=%s\n", errname(errno));
    else
        printf("result=ok\n");
    fflush(stdout);
    return 0;
}

static long num(const char *s) { return s ? strtol(s, NULL, 0) : 0; }

/* "O_WRONLY|O_CREAT" (or a number) as open flags. */
static int oflags(const char *s) {
    static const struct { const char *n; int v; } T[] = {
        {"O_RDONLY", O_RDONLY}, {"O_WRONLY", O_WRONLY}, {"O_RDWR", O_RDWR},
        {"O_CREAT", O_CREAT}, {"O_TRUNC", O_TRUNC}, {"O_APPEND", O_APPEND},
        {"O_EXCL", O_EXCL}, {"O_TMPFILE", O_TMPFILE}, {"O_PATH", O_PATH},
        {"O_DIRECTORY", O_DIRECTORY}, {"O_NOFOLLOW", O_NOFOLLOW}, {"O_CLOEXEC", O_CLOEXEC},
    };
    int f = 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", s ? s : "O_RDONLY");
    for (char *tok = strtok(buf, "|"); tok; tok = strtok(NULL, "|")) {
        int found = 0;
        for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
            if (!strcmp(tok, T[i].n)) {
                f |= T[i].v;
                found = 1;
            }
        if (!found)
            f |= (int)strtol(tok, NULL, 0);
    }
    return f;
}

/* --- generic ------------------------------------------------------------------------- */

/* sys NR [A0..A5]: a raw syscall with integer arguments (the test turns names into numbers). */
static int a_sys(int argc, char **argv) {
    long a[6] = {0};
    for (int i = 0; i < 6 && 3 + i < argc; i++)
        a[i] = num(argv[3 + i]);
    return report(syscall(num(argv[2]), a[0], a[1], a[2], a[3], a[4], a[5]));
}

/* --- foreign ABIs -------------------------------------------------------------------- */

/* A native syscall number with the x32 bit set. */
static int a_x32(int argc, char **argv) {
    (void)argc;
    return report(syscall(num(argv[2]) | 0x40000000L, 0, 0, 0));
}

/* int $0x80: the i386 ABI (NR in eax). */
static int a_int80(int argc, char **argv) {
    (void)argc;
    long nr = num(argv[2]), ret;
    __asm__ volatile("int $0x80" : "=a"(ret) : "a"(nr), "b"(0), "c"(0), "d"(0) : "memory");
    if (ret < 0 && ret > -4096) {
        errno = (int)-ret;
        return report(-1);
    }
    return report(0);
}

/* --- sockets ------------------------------------------------------------------------- */

static int a_socketpair(int argc, char **argv) {
    (void)argc;
    int sv[2];
    return report(socketpair((int)num(argv[2]), (int)num(argv[3]), 0, sv));
}

static int pair(int sv[2]) {
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0) {
        printf("result=setup-socketpair-%s\n", errname(errno));
        exit(0);
    }
    return sv[0];
}

static struct sockaddr_un unix_addr(const char *path) {
    struct sockaddr_un a;
    memset(&a, 0, sizeof a);
    a.sun_family = AF_UNIX;
    if (path[0] == '@') /* abstract */
        memcpy(a.sun_path + 1, path + 1, strlen(path + 1));
    else
        snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    return a;
}

/* sendto with a destination, on the one kind of socket the guest may have. */
static int a_sendto_dest(int argc, char **argv) {
    (void)argc;
    int sv[2];
    int fd = pair(sv);
    struct sockaddr_un a = unix_addr(argv[2]);
    return report(sendto(fd, "x", 1, 0, (struct sockaddr *)&a, sizeof a));
}

/* sendmsg with msg_name (sendmsg is allowed: only the kernel can refuse this). */
static int a_sendmsg_name(int argc, char **argv) {
    (void)argc;
    int sv[2];
    int fd = pair(sv);
    struct sockaddr_un a = unix_addr(argv[2]);
    struct iovec iov = {.iov_base = "x", .iov_len = 1};
    struct msghdr m = {.msg_name = &a, .msg_namelen = sizeof a, .msg_iov = &iov, .msg_iovlen = 1};
    return report(sendmsg(fd, &m, 0));
}

static int a_connect(int argc, char **argv) {
    (void)argc;
    int sv[2];
    int fd = pair(sv);
    struct sockaddr_un a = unix_addr(argv[2]);
    return report(connect(fd, (struct sockaddr *)&a, sizeof a));
}

static int a_bind(int argc, char **argv) {
    (void)argc;
    int sv[2];
    int fd = pair(sv);
    struct sockaddr_un a = unix_addr(argv[2]);
    return report(bind(fd, (struct sockaddr *)&a, sizeof a));
}

static int a_listen(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2];
    return report(listen(pair(sv), 1));
}

static int a_accept(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int sv[2];
    return report(accept4(pair(sv), NULL, NULL, SOCK_NONBLOCK));
}

/* --- threads and processes ----------------------------------------------------------- */

static void *thread_main(void *p) { return p; }

static int a_pthread(int argc, char **argv) {
    (void)argc;
    (void)argv;
    pthread_t t;
    int e = pthread_create(&t, NULL, thread_main, NULL);
    if (e == 0) {
        pthread_join(t, NULL);
        return report(0);
    }
    errno = e;
    return report(-1);
}

static int a_fork(int argc, char **argv) {
    (void)argc;
    (void)argv;
    pid_t p = fork();
    if (p == 0)
        _exit(0);
    if (p > 0)
        waitpid(p, NULL, 0);
    return report(p);
}

static int a_posix_spawn(int argc, char **argv) {
    (void)argc;
    (void)argv;
    pid_t p;
    char *args[] = {"/bin/true", NULL};
    int e = posix_spawn(&p, "/bin/true", NULL, NULL, args, environ);
    if (e == 0) {
        waitpid(p, NULL, 0);
        return report(0);
    }
    errno = e;
    return report(-1);
}

/* clone FLAGS: the raw syscall with a NULL stack (fork semantics; no CLONE_VM here). */
static int a_clone(int argc, char **argv) {
    (void)argc;
    unsigned long flags = strtoul(argv[2], NULL, 0);
    long p = syscall(SYS_clone, flags, 0, 0, 0, 0);
    if (p == 0)
        _exit(0);
    if (p > 0)
        waitpid((pid_t)p, NULL, __WALL);
    return report(p);
}

/* clone3 with a plain fork's arguments. */
static int a_clone3(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct {
        uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls;
    } args = {.exit_signal = SIGCHLD};
    long p = syscall(435, &args, sizeof args);
    if (p == 0)
        _exit(0);
    if (p > 0)
        waitpid((pid_t)p, NULL, 0);
    return report(p);
}

/* At most N forks: the first refusal decides. Children exit at once. */
static int a_fork_bomb(int argc, char **argv) {
    (void)argc;
    long n = num(argv[2]);
    for (long i = 0; i < n; i++) {
        pid_t p = fork();
        if (p == 0) {
            pause();
            _exit(0);
        }
        if (p < 0)
            return report(-1);
    }
    return report(0); /* every fork succeeded: the children die with PID 1 */
}

/* --- exec ---------------------------------------------------------------------------- */

static char *const true_argv[] = {"true", NULL};

static int a_execve(int argc, char **argv) {
    (void)argc;
    return report(execve(argv[2], true_argv, environ));
}

/* The dynamic loader as the program, the real one as its argument. */
static int a_execve_ldso(int argc, char **argv) {
    (void)argc;
    (void)argv;
    char *const args[] = {"/lib64/ld-linux-x86-64.so.2", "/bin/true", NULL};
    return report(execve(args[0], args, environ));
}

static int a_execveat_path(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_execveat, AT_FDCWD, argv[2], true_argv, environ, 0));
}

/* A copy of /bin/true in a memfd, run with execveat(AT_EMPTY_PATH): no path to judge. When
 * memfd_create is refused, an O_PATH descriptor of /bin/true takes its place. */
static int a_execveat_memfd(int argc, char **argv) {
    (void)argc;
    (void)argv;
    int fd = (int)syscall(SYS_memfd_create, "x", 0);
    if (fd >= 0) {
        int src = open("/bin/true", O_RDONLY);
        char buf[65536];
        ssize_t n;
        while (src >= 0 && (n = read(src, buf, sizeof buf)) > 0)
            if (write(fd, buf, (size_t)n) != n)
                break;
    } else {
        fd = open("/bin/true", O_PATH);
    }
    return report(syscall(SYS_execveat, fd, "", true_argv, environ, AT_EMPTY_PATH));
}

/* --- memory of other processes --------------------------------------------------------- */

static int a_process_vm_readv(int argc, char **argv) {
    (void)argc;
    char local[8], remote[8];
    struct iovec l = {local, 8}, r = {remote, 8};
    return report(syscall(SYS_process_vm_readv, num(argv[2]), &l, 1, &r, 1, 0));
}

static int a_process_vm_writev(int argc, char **argv) {
    (void)argc;
    char local[8] = {0}, remote[8];
    struct iovec l = {local, 8}, r = {remote, 8};
    return report(syscall(SYS_process_vm_writev, num(argv[2]), &l, 1, &r, 1, 0));
}

/* pidfd_open then pidfd_getfd: the first refusal decides. */
static int a_pidfd_getfd(int argc, char **argv) {
    (void)argc;
    long pfd = syscall(SYS_pidfd_open, num(argv[2]), 0);
    if (pfd < 0)
        return report(pfd);
    return report(syscall(SYS_pidfd_getfd, pfd, 0, 0));
}

static int a_memfd(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return report(syscall(SYS_memfd_create, "escape", 0));
}

/* --- files ----------------------------------------------------------------------------- */

static int a_open(int argc, char **argv) {
    return report(open(argv[2], oflags(argc > 3 ? argv[3] : NULL), 0644));
}

static int a_read(int argc, char **argv) {
    (void)argc;
    char buf[16];
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return report(fd);
    return report(read(fd, buf, sizeof buf));
}

static int a_openat2(int argc, char **argv) {
    struct {
        uint64_t flags, mode, resolve;
    } how = {(uint64_t)oflags(argc > 3 ? argv[3] : NULL), 0644, 0};
    return report(syscall(SYS_openat2, AT_FDCWD, argv[2], &how, sizeof how));
}

static int a_creat(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_creat, argv[2], 0644));
}

static int a_truncate(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_truncate, argv[2], 0));
}

static int a_mkdir(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_mkdir, argv[2], 0755));
}

static int a_rmdir(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_rmdir, argv[2]));
}

static int a_unlink(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_unlink, argv[2]));
}

static int a_rename(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_rename, argv[2], argv[3]));
}

static int a_exchange(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_renameat2, AT_FDCWD, argv[2], AT_FDCWD, argv[3], RENAME_EXCHANGE));
}

static int a_link(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_link, argv[2], argv[3]));
}

static int a_symlink(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_symlink, argv[2], argv[3]));
}

/* symlink TARGET LINK, then open LINK with FLAGS: the open decides. */
static int a_symlink_open(int argc, char **argv) {
    if (syscall(SYS_symlink, argv[2], argv[3]) != 0) {
        printf("result=setup-symlink-%s\n", errname(errno));
        return 0;
    }
    return report(open(argv[3], oflags(argc > 4 ? argv[4] : "O_WRONLY"), 0644));
}

/* An unnamed file in DIR (O_TMPFILE). */
static int a_tmpfile(int argc, char **argv) {
    (void)argc;
    return report(open(argv[2], O_TMPFILE | O_RDWR, 0644));
}

/* An unnamed file in DIR, then given the name DEST with linkat(AT_EMPTY_PATH). */
static int a_tmpfile_link(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_TMPFILE | O_RDWR, 0644);
    if (fd < 0) {
        printf("result=setup-tmpfile-%s\n", errname(errno));
        return 0;
    }
    return report(syscall(SYS_linkat, fd, "", AT_FDCWD, argv[3], AT_EMPTY_PATH));
}

/* The same through /proc/self/fd (no AT_EMPTY_PATH capability needed). */
static int a_tmpfile_link_proc(int argc, char **argv) {
    (void)argc;
    char p[64];
    int fd = open(argv[2], O_TMPFILE | O_RDWR, 0644);
    if (fd < 0) {
        printf("result=setup-tmpfile-%s\n", errname(errno));
        return 0;
    }
    snprintf(p, sizeof p, "/proc/self/fd/%d", fd);
    return report(syscall(SYS_linkat, AT_FDCWD, p, AT_FDCWD, argv[3], AT_SYMLINK_FOLLOW));
}

static int a_mknod(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_mknodat, AT_FDCWD, argv[2], strtol(argv[3], NULL, 8), num(argv[4])));
}

static int a_chmod(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_chmod, argv[2], 0777));
}

static int a_fchmod(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return report(fd);
    return report(syscall(SYS_fchmod, fd, 0777));
}

static int a_fchmodat(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_fchmodat, AT_FDCWD, argv[2], 0777));
}

static int a_chown(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_chown, argv[2], getuid(), getgid()));
}

static int a_fchownat(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_fchownat, AT_FDCWD, argv[2], getuid(), getgid(), 0));
}

static int a_utimensat(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_utimensat, AT_FDCWD, argv[2], NULL, 0));
}

static int a_setxattr(int argc, char **argv) {
    (void)argc;
    return report(syscall(SYS_setxattr, argv[2], "user.escape", "x", 1, 0));
}

static int a_inotify(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return report(syscall(SYS_inotify_init1, 0));
}

static int a_fanotify(int argc, char **argv) {
    (void)argc;
    (void)argv;
    return report(syscall(SYS_fanotify_init, 0, 0));
}

static int a_name_to_handle(int argc, char **argv) {
    (void)argc;
    struct {
        unsigned int bytes;
        int type;
        unsigned char h[128];
    } fh = {.bytes = 128};
    int mount_id;
    return report(syscall(SYS_name_to_handle_at, AT_FDCWD, argv[2], &fh, &mount_id, 0));
}

static int a_open_by_handle(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct {
        unsigned int bytes;
        int type;
        unsigned char h[8];
    } fh = {.bytes = 8, .type = 1}; /* shocker: a guessed handle */
    return report(syscall(SYS_open_by_handle_at, AT_FDCWD, &fh, O_RDONLY));
}

/* A directory named with a byte that is not UTF-8, inside RW, then a write that climbs out of
 * it to OUT/new: the supervisor must judge the path it cannot print. */
static int a_nonutf8_escape(int argc, char **argv) {
    (void)argc;
    char dir[2048], path[4096];
    snprintf(dir, sizeof dir, "%s/\xff\xfe", argv[2]);
    if (syscall(SYS_mkdir, dir, 0755) != 0) {
        printf("result=setup-mkdir-%s\n", errname(errno));
        return 0;
    }
    snprintf(path, sizeof path, "%s/../../out/new", dir);
    return report(open(path, O_WRONLY | O_CREAT, 0644));
}

/* chdir DIR, then open PATH (e.g. through /proc/self/cwd) with FLAGS. */
static int a_chdir_open(int argc, char **argv) {
    if (chdir(argv[2]) != 0) {
        printf("result=setup-chdir-%s\n", errname(errno));
        return 0;
    }
    return report(open(argv[3], oflags(argc > 4 ? argv[4] : "O_WRONLY|O_CREAT"), 0644));
}

/* --- fcntl and ioctl --------------------------------------------------------------------- */

static int fcntl_cmd(const char *s) {
    static const struct { const char *n; int v; } T[] = {
        {"F_SETOWN", F_SETOWN}, {"F_SETOWN_EX", F_SETOWN_EX}, {"F_SETSIG", F_SETSIG},
        {"F_SETLEASE", F_SETLEASE}, {"F_NOTIFY", F_NOTIFY}, {"F_SETPIPE_SZ", F_SETPIPE_SZ},
    };
    for (size_t i = 0; i < sizeof T / sizeof T[0]; i++)
        if (!strcmp(s, T[i].n))
            return T[i].v;
    return (int)num(s);
}

/* fcntl on a pipe: fcntl_pipe CMD ARG. */
static int a_fcntl_pipe(int argc, char **argv) {
    (void)argc;
    int p[2];
    if (pipe(p) != 0)
        return report(-1);
    if (!strcmp(argv[2], "F_SETOWN_EX")) {
        struct f_owner_ex o = {F_OWNER_PID, (pid_t)num(argv[3])};
        return report(fcntl(p[0], F_SETOWN_EX, &o));
    }
    return report(fcntl(p[0], fcntl_cmd(argv[2]), num(argv[3])));
}

/* fcntl on a file opened read-only: fcntl_file PATH CMD ARG (F_SETLEASE F_RDLCK, F_NOTIFY...). */
static int a_fcntl_file(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return report(fd);
    long arg = !strcmp(argv[4], "F_RDLCK") ? F_RDLCK : num(argv[4]);
    return report(fcntl(fd, fcntl_cmd(argv[3]), arg));
}

/* A POSIX read lock on a file opened read-only (held against host writers). */
static int a_setlk(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return report(fd);
    struct flock l = {.l_type = F_RDLCK, .l_whence = SEEK_SET};
    return report(fcntl(fd, F_SETLK, &l));
}

static int a_flock(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return report(fd);
    return report(flock(fd, LOCK_EX | LOCK_NB));
}

/* ioctl on fd 0 (stdin, /dev/null here) with a terminal or SIGIO request. */
static int a_ioctl_fd0(int argc, char **argv) {
    (void)argc;
    int v = 0;
    char c = 'x';
    unsigned long req = strtoul(argv[2], NULL, 0);
    return report(ioctl(0, req, req == TIOCSTI ? (void *)&c : (void *)&v));
}

/* ioctl on a socket pair: SIOCGIFCONF lists the interfaces of the socket's net namespace. */
static int a_ioctl_pair(int argc, char **argv) {
    (void)argc;
    int sv[2];
    int fd = pair(sv);
    char buf[1024];
    struct ifconf ifc = {.ifc_len = sizeof buf, .ifc_buf = buf};
    int v = 0;
    unsigned long req = strtoul(argv[2], NULL, 0);
    return report(ioctl(fd, req, req == SIOCGIFCONF ? (void *)&ifc : (void *)&v));
}

/* Inode flags of a read-only file, written back unchanged (FS_IOC_SETFLAGS). */
static int a_setflags(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return report(fd);
    int flags = 0;
    ioctl(fd, FS_IOC_GETFLAGS, &flags);
    return report(ioctl(fd, FS_IOC_SETFLAGS, &flags));
}

/* The same with FS_IOC_FSSETXATTR. */
static int a_fssetxattr(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_RDONLY);
    if (fd < 0)
        return report(fd);
    struct fsxattr x;
    memset(&x, 0, sizeof x);
    ioctl(fd, FS_IOC_FSGETXATTR, &x);
    return report(ioctl(fd, FS_IOC_FSSETXATTR, &x));
}

/* --- time and randomness ------------------------------------------------------------------ */

static int a_nanosleep(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct timespec t = {0, 1000000};
    return report(syscall(SYS_nanosleep, &t, NULL));
}

static int a_clock_nanosleep(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct timespec t = {0, 1000000};
    long r = syscall(SYS_clock_nanosleep, CLOCK_MONOTONIC, 0, &t, NULL);
    if (r > 0) { /* the raw syscall returns the error */
        errno = (int)r;
        r = -1;
    }
    return report(r);
}

static int a_getrandom(int argc, char **argv) {
    (void)argc;
    char buf[64];
    return report(syscall(SYS_getrandom, buf, num(argv[2]), num(argv[3])));
}

/* --- limits -------------------------------------------------------------------------------- */

/* Duplicate stdout until refused: RLIMIT_NOFILE. */
static int a_fd_exhaust(int argc, char **argv) {
    (void)argc;
    (void)argv;
    for (int i = 0; i < 100000; i++)
        if (dup(1) < 0)
            return report(-1);
    return report(0);
}

/* Map SIZE MiB of anonymous memory: RLIMIT_AS. */
static int a_mmap_big(int argc, char **argv) {
    (void)argc;
    void *p = mmap(NULL, (size_t)num(argv[2]) << 20, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    return report(p == MAP_FAILED ? -1 : 0);
}

/* One byte at offset MIB MiB of PATH: RLIMIT_FSIZE (EFBIG: PID 1 ignores SIGXFSZ). */
static int a_pwrite_far(int argc, char **argv) {
    (void)argc;
    int fd = open(argv[2], O_WRONLY | O_CREAT, 0644);
    if (fd < 0) {
        printf("result=setup-open-%s\n", errname(errno));
        return 0;
    }
    return report(pwrite(fd, "x", 1, (off_t)num(argv[3]) << 20));
}

/* Raise a hard limit: RLIMIT_NOFILE above the policy's. */
static int a_raise_nofile(int argc, char **argv) {
    (void)argc;
    (void)argv;
    struct rlimit r;
    getrlimit(RLIMIT_NOFILE, &r);
    r.rlim_cur = r.rlim_max = r.rlim_max + 1024;
    return report(setrlimit(RLIMIT_NOFILE, &r));
}

/* --- signals ------------------------------------------------------------------------------- */

/* kill(getppid(), SIG): in a PID namespace the parent is pid 0, i.e. the process group. */
static int a_kill_parent(int argc, char **argv) {
    (void)argc;
    return report(kill(getppid(), (int)num(argv[2])));
}

static int a_sigqueue(int argc, char **argv) {
    (void)argc;
    siginfo_t si;
    memset(&si, 0, sizeof si);
    si.si_code = SI_QUEUE;
    si.si_signo = (int)num(argv[3]);
    return report(syscall(SYS_rt_sigqueueinfo, num(argv[2]), si.si_signo, &si));
}

/* N distinct denied calls (signals to pids that do not matter), then socket(AF_INET): the
 * report must still name the socket. */
static int a_flood_then_socket(int argc, char **argv) {
    (void)argc;
    long n = num(argv[2]);
    for (long i = 0; i < n; i++)
        kill((pid_t)(100000 + i), 0);
    return report(socket(AF_INET, SOCK_STREAM, 0));
}

struct attempt {
    const char *name;
    int (*fn)(int, char **);
};

static const struct attempt ATTEMPTS[] = {
    {"sys", a_sys}, {"x32", a_x32}, {"int80", a_int80},
    {"socketpair", a_socketpair}, {"sendto_dest", a_sendto_dest},
    {"sendmsg_name", a_sendmsg_name}, {"connect", a_connect}, {"bind", a_bind},
    {"listen", a_listen}, {"accept", a_accept},
    {"pthread", a_pthread}, {"fork", a_fork}, {"posix_spawn", a_posix_spawn},
    {"clone", a_clone}, {"clone3", a_clone3}, {"fork_bomb", a_fork_bomb},
    {"execve", a_execve}, {"execve_ldso", a_execve_ldso}, {"execveat_path", a_execveat_path},
    {"execveat_memfd", a_execveat_memfd},
    {"process_vm_readv", a_process_vm_readv}, {"process_vm_writev", a_process_vm_writev},
    {"pidfd_getfd", a_pidfd_getfd}, {"memfd", a_memfd},
    {"open", a_open}, {"read", a_read}, {"openat2", a_openat2}, {"creat", a_creat},
    {"truncate", a_truncate}, {"mkdir", a_mkdir}, {"rmdir", a_rmdir}, {"unlink", a_unlink},
    {"rename", a_rename}, {"exchange", a_exchange}, {"link", a_link}, {"symlink", a_symlink},
    {"symlink_open", a_symlink_open}, {"tmpfile", a_tmpfile}, {"tmpfile_link", a_tmpfile_link},
    {"tmpfile_link_proc", a_tmpfile_link_proc}, {"mknod", a_mknod}, {"chmod", a_chmod},
    {"fchmod", a_fchmod}, {"fchmodat", a_fchmodat}, {"chown", a_chown},
    {"fchownat", a_fchownat}, {"utimensat", a_utimensat}, {"setxattr", a_setxattr},
    {"inotify", a_inotify}, {"fanotify", a_fanotify}, {"name_to_handle", a_name_to_handle},
    {"open_by_handle", a_open_by_handle},
    {"fcntl_pipe", a_fcntl_pipe}, {"fcntl_file", a_fcntl_file}, {"setlk", a_setlk},
    {"flock", a_flock}, {"ioctl_fd0", a_ioctl_fd0}, {"ioctl_pair", a_ioctl_pair},
    {"setflags", a_setflags}, {"fssetxattr", a_fssetxattr},
    {"nanosleep", a_nanosleep}, {"clock_nanosleep", a_clock_nanosleep},
    {"getrandom", a_getrandom},
    {"fd_exhaust", a_fd_exhaust}, {"mmap_big", a_mmap_big}, {"pwrite_far", a_pwrite_far},
    {"raise_nofile", a_raise_nofile},
    {"kill_parent", a_kill_parent}, {"sigqueue", a_sigqueue},
    {"nonutf8_escape", a_nonutf8_escape}, {"chdir_open", a_chdir_open},
    {"flood_then_socket", a_flood_then_socket},
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: attempt NAME [ARGS...]\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof ATTEMPTS / sizeof ATTEMPTS[0]; i++)
        if (!strcmp(argv[1], ATTEMPTS[i].name))
            return ATTEMPTS[i].fn(argc, argv);
    printf("result=unknown-attempt-%s\n", argv[1]);
    return 2;
}
