/* corral-keeper: ends a supervisor's cgroup root when the supervisor dies without saying so.
 *
 * A supervisor that is SIGKILLed, crashes or is OOM-killed cannot stop its tasks: they would
 * outlive their time limits.  This small program, started by supervisor/_keeper.py beside every
 * supervisor, waits on a pidfd of the supervisor.  When it turns readable (the whole thread group
 * has exited, see pidfd_open(2)) the keeper writes 1 to the root's cgroup.kill, thaws the subtree,
 * waits for "populated 0" in cgroup.events, removes every cgroup of the subtree depth-first
 * (rmdir, EBUSY retried briefly), prints one line on stderr saying what it did, and exits.
 *
 *   corral-keeper --pid PID --pidfd FD --root-fd FD --root PATH [--kill signal]
 *
 *   fd 0       the control pipe: one byte per command, 'R' (release: the supervisor hands its
 *              tasks over on purpose; exit without killing) or 'X' (exit: the supervisor removed
 *              its cgroups itself).  EOF without a command is not a command: the supervisor may
 *              have exec'd, or a forked child may hold a copy; keep waiting on the pidfd.
 *   fd 1       the ready pipe: "ok\n" once armed, or "error: ...\n" before exiting 2.
 *   fd 2       where failures and the final report go.
 *   --pidfd    a pidfd of the supervisor; --pid is its pid, for the report only.
 *   --root-fd  a directory fd of the root (a dup of the supervisor's: it shares the supervisor's
 *              flock, so the root stays locked, and no other corral's reaper touches it, until
 *              the keeper has finished and exits).  All work is relative to it (openat,
 *              unlinkat); --root is the path used in messages only.
 *   --kill signal  the fallback for kernels without cgroup.kill (< 5.14), forced (a test seam):
 *              freeze the subtree, SIGKILL every listed pid (a frozen process can neither fork
 *              nor exit, so no pid is missed or reused), thaw.
 *
 * The keeper runs in its own session and ignores the terminal's and the usual stop signals,
 * so Ctrl-C, Ctrl-Z or the hangup of a closed terminal aimed at the supervisor never reach it.
 * Exit status: 0 done (or released / told to exit), 1 the cleanup was incomplete (each failure
 * is on stderr), 2 bad arguments or fds (the message went to the ready pipe).
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_send_signal
#define SYS_pidfd_send_signal 424
#endif
#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

#define WAIT_EMPTY_MS 10000  /* how long processes may take to die before we give up */
#define REKILL_MS 1000       /* cgroup.kill again this often while waiting */
#define RESWEEP_MS 1000      /* the signal fallback sweeps again this often */
#define FREEZE_MS 1000       /* the fallback signals anyway if the freeze takes longer */
#define BUSY_MS 2000         /* EBUSY from rmdir is retried this long, for the whole tree */

enum outcome { SUPERVISOR_DIED, RELEASED, TOLD_TO_EXIT };

struct path {
    char buf[PATH_MAX];
    size_t len;
};

struct keeper {
    long pid;
    int pidfd;
    int root_fd;
    dev_t root_dev;
    bool fallback;
    bool incomplete;
    long long busy_deadline;
    struct path path;
    char first_error[PATH_MAX + 128];
};

/* Milliseconds on the monotonic clock. */
static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Sleeps ms milliseconds (restarted after a signal). */
static void sleep_ms(long ms)
{
    struct timespec ts = { ms / 1000, (ms % 1000) * 1000000L };
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Appends "/name" to p for messages; returns the old length for path_pop.  A path too long
 * to show is cut (messages only: nothing is ever opened by this string). */
static size_t path_push(struct path *p, const char *name)
{
    size_t old = p->len;
    int n = snprintf(p->buf + p->len, sizeof p->buf - p->len, "/%s", name);
    if (n > 0)
        p->len += (size_t)n < sizeof p->buf - p->len ? (size_t)n : sizeof p->buf - p->len - 1;
    return old;
}

/* Restores p to the length path_push returned. */
static void path_pop(struct path *p, size_t old)
{
    p->len = old;
    p->buf[old] = '\0';
}

/* Reports a failed step on stderr as "cannot VERB PATH[/NAME]: REASON", marks the cleanup
 * incomplete and keeps the first such message for the final line. */
static void fail(struct keeper *k, const char *verb, const char *name, int err)
{
    char msg[sizeof k->first_error];
    snprintf(msg, sizeof msg, "cannot %s %s%s%s: %s", verb, k->path.buf, name ? "/" : "",
             name ? name : "", strerror(err));
    fprintf(stderr, "corral-keeper: %s\n", msg);
    if (!k->incomplete)
        snprintf(k->first_error, sizeof k->first_error, "%s", msg);
    k->incomplete = true;
}

/* Writes text to interface file name of the cgroup at dir_fd; 0 or -errno. */
static int write_file(int dir_fd, const char *name, const char *text)
{
    int fd = openat(dir_fd, name, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    ssize_t n;
    do {
        n = write(fd, text, strlen(text));
    } while (n < 0 && errno == EINTR);
    int err = n < 0 ? errno : 0;
    close(fd);
    return -err;
}

/* Reads key ("populated", "frozen") from the cgroup.events open at fd: 0/1, or -errno. */
static int read_event(int fd, const char *key)
{
    char buf[256];
    ssize_t n;
    do {
        n = pread(fd, buf, sizeof buf - 1, 0);
    } while (n < 0 && errno == EINTR);
    if (n < 0)
        return errno == ENODEV ? -ENOENT : -errno;  /* ENODEV: the cgroup was removed */
    buf[n] = '\0';
    size_t klen = strlen(key);
    for (char *line = buf; *line; ) {
        if (strncmp(line, key, klen) == 0 && line[klen] == ' ')
            return line[klen + 1] == '1';
        char *next = strchr(line, '\n');
        if (!next)
            break;
        line = next + 1;
    }
    return -EPROTO;
}

/* Waits until key in cgroup.events (open at fd) reads want, or deadline; every period_ms
 * calls again(k) (NULL: nothing).  Returns 0, -ETIMEDOUT or -errno.  cgroup.events is a
 * kernfs file: poll(2) reports POLLPRI when its content changes (and always POLLIN, so only
 * POLLPRI is asked for); each read re-arms it. */
static int wait_event(struct keeper *k, int fd, const char *key, int want, long long deadline,
                      long period_ms, void (*again)(struct keeper *))
{
    for (;;) {
        int v = read_event(fd, key);
        if (v < 0 || v == want)
            return v < 0 ? v : 0;
        long long left = deadline - now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd pfd = { fd, POLLPRI, 0 };
        int n = poll(&pfd, 1, (int)(left < period_ms ? left : period_ms));
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n == 0 && again)
            again(k);
    }
}

typedef void (*visit_fn)(struct keeper *k, int fd);

/* Calls visit on the cgroup at fd and then on every sub-cgroup, depth-first; with remove,
 * rmdirs each sub-cgroup after its own subtree.  k->path names fd's cgroup.  Failures are
 * reported through fail() and the walk goes on with the rest. */
static void walk(struct keeper *k, int fd, visit_fn visit, bool remove);

/* rmdir of sub-cgroup name of dir_fd, retrying EBUSY (the kernel answers it briefly even
 * after "populated 0") until k->busy_deadline; a cgroup already gone is fine. */
static void remove_child(struct keeper *k, int dir_fd, const char *name)
{
    long wait = 1;
    while (unlinkat(dir_fd, name, AT_REMOVEDIR) < 0) {
        if (errno == ENOENT)
            return;
        if (errno != EBUSY || now_ms() >= k->busy_deadline) {
            fail(k, "remove", name, errno);
            return;
        }
        sleep_ms(wait);
        wait = wait < 64 ? wait * 2 : wait;
    }
}

/* Visits the sub-cgroup name of dir_fd (see walk).  Never crosses into another filesystem
 * (something mounted on a cgroup directory): that is reported, and its rmdir fails EBUSY. */
static void walk_child(struct keeper *k, int dir_fd, const char *name, visit_fn visit,
                       bool remove)
{
    struct stat st;
    int fd = openat(dir_fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOENT)  /* removed meanwhile: nothing to do there */
            fail(k, "open", name, errno);
        return;
    }
    int err = fstat(fd, &st) < 0 ? errno : st.st_dev != k->root_dev ? EXDEV : 0;
    if (err) {
        fail(k, "walk into", name, err);
        close(fd);
        return;
    }
    size_t old = path_push(&k->path, name);
    walk(k, fd, visit, remove);
    path_pop(&k->path, old);
    close(fd);
    if (remove)
        remove_child(k, dir_fd, name);
}

static void walk(struct keeper *k, int fd, visit_fn visit, bool remove)
{
    if (visit)
        visit(k, fd);
    /* A fresh open file description of the same directory, so that readdir has its own offset
     * and closedir does not close fd. */
    int list_fd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = list_fd < 0 ? NULL : fdopendir(list_fd);
    if (!dir) {
        int err = errno;
        if (list_fd >= 0)
            close(list_fd);
        if (err != ENOENT)
            fail(k, "list the sub-cgroups of", NULL, err);
        return;
    }
    struct dirent *d;
    for (errno = 0; (d = readdir(dir)) != NULL; errno = 0) {
        if (d->d_type != DT_DIR || strcmp(d->d_name, ".") == 0 || strcmp(d->d_name, "..") == 0)
            continue;  /* kernfs always fills d_type; a cgroup's only directories are cgroups */
        walk_child(k, fd, d->d_name, visit, remove);
    }
    if (errno != 0 && errno != ENOENT)
        fail(k, "list the sub-cgroups of", NULL, errno);
    closedir(dir);
}

/* Writes 0 to cgroup.freeze of the cgroup at fd (something may have frozen it). */
static void thaw_one(struct keeper *k, int fd)
{
    int rc = write_file(fd, "cgroup.freeze", "0");
    if (rc < 0 && rc != -ENOENT)
        fail(k, "thaw", "cgroup.freeze", -rc);
}

/* Writes 1 to cgroup.freeze of the cgroup at fd (the fallback freezes the root only). */
static int freeze_root(struct keeper *k)
{
    int rc = write_file(k->root_fd, "cgroup.freeze", "1");
    if (rc < 0)
        fail(k, "freeze", "cgroup.freeze", -rc);
    return rc;
}

/* SIGKILLs every pid listed in cgroup.procs of the cgroup at fd (the signal fallback). */
static void kill_listed(struct keeper *k, int fd)
{
    int procs = openat(fd, "cgroup.procs", O_RDONLY | O_CLOEXEC);
    if (procs < 0) {
        if (errno != ENOENT)
            fail(k, "read", "cgroup.procs", errno);
        return;
    }
    char buf[4096];
    long pid = 0;
    ssize_t n;
    while ((n = read(procs, buf, sizeof buf)) != 0) {
        if (n < 0) {
            if (errno == EINTR)
                continue;
            if (errno != ENODEV)
                fail(k, "read", "cgroup.procs", errno);
            break;
        }
        for (ssize_t i = 0; i < n; i++) {
            if (buf[i] >= '0' && buf[i] <= '9') {
                pid = pid * 10 + (buf[i] - '0');
            } else if (pid > 0) {
                if (kill((pid_t)pid, SIGKILL) < 0 && errno != ESRCH)
                    fail(k, "signal a process listed in", "cgroup.procs", errno);
                pid = 0;
            }
        }
    }
    close(procs);
}

/* One more SIGKILL sweep of the whole tree (the fallback, while waiting for empty). */
static void sweep(struct keeper *k)
{
    walk(k, k->root_fd, kill_listed, false);
}

/* cgroup.kill again (harmless on dying processes; catches anything moved in meanwhile). */
static void rekill(struct keeper *k)
{
    int rc = write_file(k->root_fd, "cgroup.kill", "1");
    if (rc < 0 && rc != -ENOENT)
        fail(k, "write", "cgroup.kill", -rc);
}

/* The fallback for kernels without cgroup.kill: freeze, SIGKILL each listed pid, thaw. */
static void kill_by_signals(struct keeper *k, int events_fd)
{
    if (freeze_root(k) == 0) {
        int rc = wait_event(k, events_fd, "frozen", 1, now_ms() + FREEZE_MS, FREEZE_MS, NULL);
        if (rc < 0 && rc != -ETIMEDOUT)
            fail(k, "watch", "cgroup.events", -rc);
    }
    sweep(k);
}

/* SIGKILLs everything in the subtree, thaws it, waits until it is empty (failures: fail()). */
static void kill_and_wait(struct keeper *k, int events_fd)
{
    int rc = -ENOENT;
    if (!k->fallback)
        rc = write_file(k->root_fd, "cgroup.kill", "1");
    if (rc == -ENOENT) {  /* kernel < 5.14 (cgroup.events exists, so the cgroup does) */
        k->fallback = true;
        kill_by_signals(k, events_fd);
    } else if (rc < 0) {
        fail(k, "write", "cgroup.kill", -rc);
    }
    walk(k, k->root_fd, thaw_one, false);
    rc = wait_event(k, events_fd, "populated", 0, now_ms() + WAIT_EMPTY_MS,
                    k->fallback ? RESWEEP_MS : REKILL_MS, k->fallback ? sweep : rekill);
    if (rc == -ETIMEDOUT) {
        fprintf(stderr, "corral-keeper: %s still held processes %d s after the kill\n",
                k->path.buf, WAIT_EMPTY_MS / 1000);
        if (!k->incomplete)
            snprintf(k->first_error, sizeof k->first_error, "it still held processes %d s "
                     "after the kill", WAIT_EMPTY_MS / 1000);
        k->incomplete = true;
    } else if (rc < 0) {
        fail(k, "watch", "cgroup.events", -rc);
    }
}

/* The name under which the directory parent_fd lists the root (same device and inode):
 * written into name; 0, or -errno (-ENOENT: not there any more). */
static int find_root_name(struct keeper *k, int parent_fd, char *name, size_t size)
{
    struct stat want, st;
    if (fstat(k->root_fd, &want) < 0)
        return -errno;
    int list_fd = openat(parent_fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *dir = list_fd < 0 ? NULL : fdopendir(list_fd);
    if (!dir) {
        int err = errno;
        if (list_fd >= 0)
            close(list_fd);
        return -err;
    }
    int rc = -ENOENT;
    struct dirent *d;
    while ((d = readdir(dir)) != NULL) {
        if (d->d_type != DT_DIR || strcmp(d->d_name, "..") == 0 || strcmp(d->d_name, ".") == 0)
            continue;
        if (fstatat(parent_fd, d->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 &&
            st.st_dev == want.st_dev && st.st_ino == want.st_ino) {
            snprintf(name, size, "%s", d->d_name);
            rc = 0;
            break;
        }
    }
    closedir(dir);
    return rc;
}

/* Removes the root itself: through its parent (openat "..") and the name found by inode. */
static void remove_root(struct keeper *k)
{
    char name[NAME_MAX + 1];
    int parent = openat(k->root_fd, "..", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (parent < 0) {
        fail(k, "open the parent of", NULL, errno);
        return;
    }
    int rc = find_root_name(k, parent, name, sizeof name);
    if (rc == 0) {
        struct path saved = k->path;  /* fail() names parent/name: show the root's own path */
        char *slash = strrchr(k->path.buf, '/');
        if (slash && slash != k->path.buf)
            path_pop(&k->path, (size_t)(slash - k->path.buf));
        remove_child(k, parent, name);
        k->path = saved;
    } else if (rc != -ENOENT || faccessat(k->root_fd, "cgroup.events", F_OK, 0) == 0) {
        /* not listed by its ".." though still there: a mount root, e.g. in a container */
        fail(k, "find the directory entry of", NULL, -rc);
    }
    close(parent);
}

/* The final line: what was done, or the first thing that failed; returns the exit status. */
static int report(struct keeper *k, int populated)
{
    if (k->incomplete) {
        fprintf(stderr, "corral-keeper: supervisor pid %ld died; the cleanup of %s is "
                "incomplete: %s\n", k->pid, k->path.buf, k->first_error);
        return 1;
    }
    if (populated)
        fprintf(stderr, "corral-keeper: supervisor pid %ld died; killed the processes of %s "
                "and removed it\n", k->pid, k->path.buf);
    else
        fprintf(stderr, "corral-keeper: supervisor pid %ld died; %s held no processes; "
                "removed it\n", k->pid, k->path.buf);
    return 0;
}

/* The whole cleanup after the supervisor died; returns the exit status. */
static int cleanup(struct keeper *k)
{
    int populated = -ENOENT;
    int events = openat(k->root_fd, "cgroup.events", O_RDONLY | O_CLOEXEC);
    if (events >= 0)
        populated = read_event(events, "populated");
    else if (errno != ENOENT)
        populated = -errno;
    if (populated == -ENOENT) {
        fprintf(stderr, "corral-keeper: supervisor pid %ld died; %s was already removed\n",
                k->pid, k->path.buf);
        if (events >= 0)
            close(events);
        return 0;
    }
    if (populated < 0)  /* unreadable: kill to be safe */
        fail(k, "read", "cgroup.events", -populated);
    if (populated != 0 && events >= 0)
        kill_and_wait(k, events);
    else if (populated != 0)
        rekill(k);
    if (events >= 0)
        close(events);
    k->busy_deadline = now_ms() + BUSY_MS;
    walk(k, k->root_fd, NULL, true);
    remove_root(k);
    return report(k, populated);
}

/* Reads one command from the control pipe: RELEASED, TOLD_TO_EXIT, -1 (keep waiting), or
 * -2 (EOF or a broken pipe: stop watching it). */
static int read_command(void)
{
    char c;
    ssize_t n = read(0, &c, 1);
    if (n < 0)
        return errno == EINTR || errno == EAGAIN ? -1 : -2;
    if (n == 0)
        return -2;
    if (c == 'R')
        return RELEASED;
    if (c == 'X')
        return TOLD_TO_EXIT;
    fprintf(stderr, "corral-keeper: ignoring unknown command byte 0x%02x\n", (unsigned char)c);
    return -1;
}

/* Waits until the supervisor dies or sends a command.  A command already in the pipe when
 * the supervisor's pidfd turns readable wins: it was sent before the supervisor exited. */
static enum outcome wait_for_supervisor(struct keeper *k)
{
    struct pollfd fds[2] = { { 0, POLLIN, 0 }, { k->pidfd, POLLIN, 0 } };
    for (;;) {
        if (poll(fds, 2, -1) < 0) {
            if (errno != EINTR) {
                fprintf(stderr, "corral-keeper: poll: %s\n", strerror(errno));
                sleep_ms(100);
            }
            continue;
        }
        if (fds[0].revents) {
            int cmd = read_command();
            if (cmd >= 0)
                return (enum outcome)cmd;
            if (cmd == -2)
                fds[0].fd = -1;  /* poll ignores negative fds */
        }
        if (fds[1].revents)
            return SUPERVISOR_DIED;
    }
}

/* Writes "error: MESSAGE" to the ready pipe and exits 2: the keeper could not be armed. */
static void refuse(const char *fmt, ...)
{
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    dprintf(1, "error: %s\n", msg);
    exit(2);
}

/* Parses a non-negative decimal number for option opt, or refuses. */
static long number(const char *opt, const char *text)
{
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < 0)
        refuse("%s must be a non-negative number, got \"%s\"", opt, text);
    return v;
}

/* Fills k from the command line, or refuses. */
static void parse_args(struct keeper *k, int argc, char **argv)
{
    static const struct option opts[] = {
        { "pid", required_argument, NULL, 'p' },     { "pidfd", required_argument, NULL, 'f' },
        { "root-fd", required_argument, NULL, 'r' }, { "root", required_argument, NULL, 'P' },
        { "kill", required_argument, NULL, 'k' },    { NULL, 0, NULL, 0 },
    };
    int c;
    k->pid = k->pidfd = k->root_fd = -1;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 'p')
            k->pid = number("--pid", optarg);
        else if (c == 'f')
            k->pidfd = (int)number("--pidfd", optarg);
        else if (c == 'r')
            k->root_fd = (int)number("--root-fd", optarg);
        else if (c == 'P')
            snprintf(k->path.buf, sizeof k->path.buf, "%s", optarg);
        else if (c == 'k' && strcmp(optarg, "signal") == 0)
            k->fallback = true;
        else
            refuse("usage: corral-keeper --pid PID --pidfd FD --root-fd FD --root PATH "
                   "[--kill signal] (it is started by corral, not by hand)");
    }
    k->path.len = strlen(k->path.buf);
    if (k->pid < 0 || k->pidfd < 0 || k->root_fd < 0 || k->path.len == 0 || optind != argc)
        refuse("--pid, --pidfd, --root-fd and --root are all required");
}

/* Ignores the signals a terminal or a service manager aims at the supervisor, checks the fds,
 * then says "ok" on the ready pipe; refuses (exit 2) on any failure. */
static void arm(struct keeper *k)
{
    static const int ignored[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT,
                                   SIGTSTP, SIGTTIN, SIGTTOU, SIGPIPE };
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_IGN;
    for (size_t i = 0; i < sizeof ignored / sizeof ignored[0]; i++)
        if (sigaction(ignored[i], &sa, NULL) < 0)
            refuse("sigaction(%d): %s", ignored[i], strerror(errno));
    struct statfs fs;
    if (fstatfs(k->root_fd, &fs) < 0)
        refuse("--root-fd %d (%s): %s", k->root_fd, k->path.buf, strerror(errno));
    struct stat st;
    if (fs.f_type != CGROUP2_SUPER_MAGIC || fstat(k->root_fd, &st) < 0)
        refuse("--root-fd %d (%s) is not a directory on a cgroup2 filesystem", k->root_fd,
               k->path.buf);
    k->root_dev = st.st_dev;
    if (faccessat(k->root_fd, "cgroup.events", F_OK, 0) < 0)
        refuse("%s has no cgroup.events (%s): it is gone, or the root of a hierarchy, which "
               "must never be killed", k->path.buf, strerror(errno));
    /* Signal 0 checks the fd is a pidfd (EBADF otherwise) without sending anything; ESRCH
     * (already dead) is fine: the first poll then starts the cleanup. */
    if (syscall(SYS_pidfd_send_signal, k->pidfd, 0, NULL, 0) < 0 && errno != ESRCH &&
        errno != EPERM)
        refuse("--pidfd %d is not a pidfd: %s", k->pidfd, strerror(errno));
    /* A deep subtree holds two fds per level during the depth-first walk. */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);  /* best effort: a shallow tree needs few */
    }
    /* A supervisor that died meanwhile cannot read it (EPIPE): its pidfd says so, go on. */
    if (dprintf(1, "ok\n") < 0)
        fprintf(stderr, "corral-keeper: writing to the ready pipe: %s\n", strerror(errno));
    /* Close the ready pipe (the supervisor reads to EOF) but keep fd 1 taken, so that no
     * cgroup file we open later can become "stdout". */
    if (dup2(2, 1) < 0)
        fprintf(stderr, "corral-keeper: dup2: %s\n", strerror(errno));
}

int main(int argc, char **argv)
{
    struct keeper k;
    memset(&k, 0, sizeof k);
    parse_args(&k, argc, argv);
    arm(&k);
    switch (wait_for_supervisor(&k)) {
    case RELEASED:
    case TOLD_TO_EXIT:
        return 0;
    case SUPERVISOR_DIED:
        break;
    }
    return cleanup(&k);
}
