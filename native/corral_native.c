/* corral's native helper: spawn straight into a cgroup v2 leaf, report exec failures exactly.
 *
 * Why C: between clone and execve the child may only do async-signal-safe work, and it must
 * never return to Python.  Three ways to create the child, tried in this order:
 *
 *   1. clone3(CLONE_INTO_CGROUP | CLONE_PIDFD | CLONE_VM | CLONE_VFORK) on a private stack
 *      (x86_64 only: the child starts on its own stack through a few lines of assembly, like
 *      glibc's posix_spawn; no page tables are copied, so this is as cheap as posix_spawn).
 *   2. clone3(CLONE_INTO_CGROUP | CLONE_PIDFD) with fork semantics, on other architectures.
 *   3. Where clone3 or CLONE_INTO_CGROUP is refused (kernels before 5.7; seccomp profiles of
 *      older container engines answer ENOSYS or EPERM): vfork(), the child writes "0" into the
 *      leaf's cgroup.procs before anything else, the parent takes a pidfd with pidfd_open().
 *      The child is still in its leaf before it execs; the result says this path was used.
 *
 * Between clone and exec the child also isolates itself as asked (systemd.exec(5)'s order):
 * a network namespace (joined, or new with "lo" up), a mount namespace made a slave of ours
 * with tmpfs mounts and read-only remounts in it, rlimits, groups, the capability bounding
 * set, ambient capabilities kept across the uid change, the uid, no_new_privs.  Everything it
 * needs (paths, masks, ids) was computed by the parent: the child only makes syscalls.
 *
 * The child writes its failure (step + errno + index) into a report the parent reads: shared
 * memory when the child shares our address space (1 and 3), a CLOEXEC pipe otherwise (2).  While the
 * child runs in our memory every signal is blocked in the parent thread, so no Python signal
 * handler can run in the child and write into the parent's state.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <net/if.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/signalfd.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include "corral_native.h"

#ifndef SYS_clone3
#define SYS_clone3 435
#endif
#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif
#ifndef SYS_kcmp
#define SYS_kcmp 312
#endif
#ifndef KCMP_VM
#define KCMP_VM 1
#endif
#ifndef SYS_close_range
#define SYS_close_range 436
#endif
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000
#endif
#ifndef CLONE_INTO_CGROUP
#define CLONE_INTO_CGROUP 0x200000000ULL
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef P_PIDFD
#define P_PIDFD 3
#endif
#ifndef PR_CAP_AMBIENT
#define PR_CAP_AMBIENT 47
#define PR_CAP_AMBIENT_RAISE 2
#endif

/* struct clone_args as of Linux 5.7 (CLONE_ARGS_SIZE_VER2), spelled out so that old kernel
 * headers do not matter. */
struct corral_clone_args {
    uint64_t flags;
    uint64_t pidfd;
    uint64_t child_tid;
    uint64_t parent_tid;
    uint64_t exit_signal;
    uint64_t stack;
    uint64_t stack_size;
    uint64_t tls;
    uint64_t set_tid;
    uint64_t set_tid_size;
    uint64_t cgroup;
};

struct child_report {
    int step;
    int err;
    int index;
};

struct child_ctx {
    const struct corral_spawn_args *a;
    struct child_report *report;  /* shared memory (vfork-like paths) */
    int report_fd;                /* pipe write end (fork-like path), else -1 */
    int procs_fd;                 /* cgroup.procs of the leaf (fallback path), else -1 */
};

/* The child's stack for path 1.  It lives in the parent's frame: the parent thread is
 * suspended (CLONE_VFORK) until the child execs or exits, so nothing else uses it. */
#define CHILD_STACK_SIZE (32 * 1024)

/* ---- the child: async-signal-safe only, never returns ---------------------------------- */

static void __attribute__((noreturn)) child_fail_at(const struct child_ctx *c, int step,
                                                     int err, int index)
{
    struct child_report rep = { step, err, index };
    if (c->report_fd >= 0) {
        ssize_t n;
        do {
            n = write(c->report_fd, &rep, sizeof rep);
        } while (n < 0 && errno == EINTR);
    } else {
        *c->report = rep;
    }
    _exit(127);
}

static void __attribute__((noreturn)) child_fail(const struct child_ctx *c, int step, int err)
{
    child_fail_at(c, step, err, 0);
}

/* Move each of the three std fds out of 0..2 first, so that installing one cannot clobber
 * the source of another (e.g. stdout given as fd 0). */
static int child_install_std_fds(const struct corral_spawn_args *a)
{
    int src[3] = { a->stdin_fd, a->stdout_fd, a->stderr_fd };
    for (int i = 0; i < 3; i++) {
        if (src[i] < 0)
            return EBADF;
        if (src[i] < 3 && src[i] != i) {
            int moved = fcntl(src[i], F_DUPFD_CLOEXEC, 3);
            if (moved < 0)
                return errno;
            for (int j = i + 1; j < 3; j++)
                if (src[j] == src[i])
                    src[j] = moved;
            src[i] = moved;
        }
    }
    for (int i = 0; i < 3; i++) {
        if (src[i] == i) {
            /* already in place: only make sure it survives exec */
            int fl = fcntl(i, F_GETFD);
            if (fl < 0 || fcntl(i, F_SETFD, fl & ~FD_CLOEXEC) < 0)
                return errno;
        } else if (dup2(src[i], i) < 0) {
            return errno;
        }
    }
    return 0;
}

/* Every fd above 2 is closed at exec, except pass_fds.  Marking them CLOEXEC instead of
 * closing them keeps the report pipe usable until the exec itself. */
static int child_close_other_fds(const struct corral_spawn_args *a)
{
    if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
        struct rlimit rl;
        if (errno != ENOSYS && errno != EINVAL)
            return errno;
        /* kernels before 5.11: walk the whole table */
        if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
            return errno;
        for (rlim_t fd = 3; fd < rl.rlim_cur && fd < (rlim_t)INT_MAX; fd++) {
            int fl = fcntl((int)fd, F_GETFD);
            if (fl >= 0 && !(fl & FD_CLOEXEC))
                fcntl((int)fd, F_SETFD, fl | FD_CLOEXEC);
        }
    }
    for (int i = 0; i < a->n_pass_fds; i++) {
        int fd = a->pass_fds[i];
        int fl = fcntl(fd, F_GETFD);
        if (fl < 0 || fcntl(fd, F_SETFD, fl & ~FD_CLOEXEC) < 0)
            return errno;
    }
    return 0;
}

/* The numbered fds given to the task as 3, 4, ... in order (as systemd passes sockets, and a
 * shell can name: dash takes single-digit fd numbers only).  Each source is first moved above
 * every target, so that installing one cannot clobber the source of another, nor the report
 * pipe (moved above them too: only the fork-like path has one, in memory of the child's own). */
static int child_number_fds(struct child_ctx *c)
{
    const struct corral_spawn_args *a = c->a;
    int n = a->n_numbered_fds;
    int moved[CORRAL_MAX_NUMBERED_FDS];
    if (n <= 0)
        return 0;
    if (n > CORRAL_MAX_NUMBERED_FDS)
        return EINVAL;
    if (c->report_fd >= 3 && c->report_fd < 3 + n) {
        int r = fcntl(c->report_fd, F_DUPFD_CLOEXEC, 3 + n);
        if (r < 0)
            return errno;
        c->report_fd = r;
    }
    for (int i = 0; i < n; i++) {
        moved[i] = fcntl(a->numbered_fds[i], F_DUPFD_CLOEXEC, 3 + n);
        if (moved[i] < 0)
            return errno;
    }
    for (int i = 0; i < n; i++) {
        if (dup2(moved[i], 3 + i) < 0)  /* (the new fd is not close-on-exec) */
            return errno;
        close(moved[i]);
    }
    return 0;
}

/* "lo" up in a fresh network namespace (the kernel gives it 127.0.0.1/8 and ::1 as it comes
 * up); the SIOCSIFFLAGS ioctl is two syscalls where netlink would be a message exchange. */
static int child_loopback_up(void)
{
    struct ifreq ifr;
    int err = 0;
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0)
        return errno;
    memset(&ifr, 0, sizeof ifr);
    memcpy(ifr.ifr_name, "lo", 3);
    if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
        err = errno;
    } else {
        ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
            err = errno;
    }
    close(s);
    return err;
}

static void child_network(const struct child_ctx *c, const struct corral_spawn_args *a)
{
    int err;
    if (a->flags & CORRAL_SPAWN_SETNS) {
        if (setns(a->netns_fd, CLONE_NEWNET) < 0)
            child_fail(c, CORRAL_STEP_NETNS, errno);
    } else if (a->flags & CORRAL_SPAWN_NEWNET) {
        if (unshare(CLONE_NEWNET) < 0)
            child_fail(c, CORRAL_STEP_NETNS, errno);
        if ((err = child_loopback_up()) != 0)
            child_fail(c, CORRAL_STEP_LOOPBACK, err);
    }
}

/* Our own mount namespace, then every mount in it made a slave: mounts of the host still
 * reach us, nothing we mount or remount reaches the host (mount_namespaces(7)).  Only then
 * the tmpfs mounts and the read-only remounts, which therefore stay the task's own. */
static void child_mounts(const struct child_ctx *c, const struct corral_spawn_args *a)
{
    if (!(a->flags & CORRAL_SPAWN_NEWNS))
        return;
    if (unshare(CLONE_NEWNS) < 0)
        child_fail(c, CORRAL_STEP_MOUNTNS, errno);
    if (mount(NULL, "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
        child_fail(c, CORRAL_STEP_MOUNTNS, errno);
    for (int i = 0; i < a->n_tmpfs; i++)
        if (mount("tmpfs", a->tmpfs_paths[i], "tmpfs", MS_NOSUID | MS_NODEV, "mode=01777") < 0)
            child_fail_at(c, CORRAL_STEP_TMPFS, errno, i);
    /* A bind remount changes this mount's flags only (not the filesystem's, not the host's
     * view of it); the mount's nosuid/nodev/noexec/atime flags are given back with it. */
    for (int i = 0; i < a->n_readonly; i++)
        if (mount(NULL, a->readonly_paths[i], NULL,
                  MS_BIND | MS_REMOUNT | MS_RDONLY | a->readonly_flags[i], NULL) < 0)
            child_fail_at(c, CORRAL_STEP_READONLY, errno, i);
}

/* Needs CAP_SETPCAP: before the uid change.  Dropping from the bounding set leaves our own
 * permitted set alone, so setresuid() below still works with CAP_SETUID dropped. */
static void child_bounding_set(const struct child_ctx *c, const struct corral_spawn_args *a)
{
    if (!(a->flags & CORRAL_SPAWN_CAPBSET))
        return;
    for (int cap = 0; cap <= a->cap_last && cap < 64; cap++)
        if ((a->cap_bset_drop >> cap) & 1)
            if (prctl(PR_CAPBSET_DROP, (unsigned long)cap, 0UL, 0UL, 0UL) < 0)
                child_fail_at(c, CORRAL_STEP_CAPBSET, errno, cap);
}

/* Ambient capabilities must be in the permitted and inheritable sets when raised, and a uid
 * change away from 0 clears the ambient set (capabilities(7)).  So: inheritable set to the
 * ambient ones and keep-caps on before the uid change; the raise comes after it. */
static void child_ambient_prepare(const struct child_ctx *c, const struct corral_spawn_args *a)
{
    struct __user_cap_header_struct hdr = { _LINUX_CAPABILITY_VERSION_3, 0 };
    struct __user_cap_data_struct data[2];
    if (!(a->flags & CORRAL_SPAWN_AMBIENT))
        return;
    memset(data, 0, sizeof data);
    if (syscall(SYS_capget, &hdr, data) < 0)
        child_fail(c, CORRAL_STEP_CAPS, errno);
    data[0].inheritable = (uint32_t)a->cap_ambient;
    data[1].inheritable = (uint32_t)(a->cap_ambient >> 32);
    if (syscall(SYS_capset, &hdr, data) < 0)
        child_fail(c, CORRAL_STEP_CAPS, errno);
    if ((a->flags & CORRAL_SPAWN_SETUID) && a->uid != 0 &&
        prctl(PR_SET_KEEPCAPS, 1UL, 0UL, 0UL, 0UL) < 0)
        child_fail(c, CORRAL_STEP_CAPS, errno);
}

static void child_ambient_raise(const struct child_ctx *c, const struct corral_spawn_args *a)
{
    if (!(a->flags & CORRAL_SPAWN_AMBIENT))
        return;
    for (int cap = 0; cap <= a->cap_last && cap < 64; cap++)
        if ((a->cap_ambient >> cap) & 1)
            if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, (unsigned long)cap, 0UL, 0UL) < 0)
                child_fail_at(c, CORRAL_STEP_AMBIENT, errno, cap);
}

/* clone3(CLONE_INTO_CGROUP) starts a child in any cgroup whose directory the caller can open
 * (even read-only: the kernel checks the target's cgroup.procs with inode_permission(), which
 * a read-only *mount* does not change), so a read-only cgroupfs alone does not keep a root task
 * in its leaf.  This filter makes clone3 answer ENOSYS: libc falls back to clone(), which has
 * no way to name a cgroup (Docker's default profile does the same).  Syscall 435 is clone3 on
 * every architecture (the numbers were unified before it came); on x32 it has bit 30 set.
 * Installed while the child still has CAP_SYS_ADMIN (before the uid change), so it needs no
 * no_new_privs. */
static void child_no_clone3(const struct child_ctx *c, const struct corral_spawn_args *a)
{
    struct sock_filter code[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 435, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, 435 | 0x40000000, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (ENOSYS & SECCOMP_RET_DATA)),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = { (unsigned short)(sizeof code / sizeof code[0]), code };
    if (!(a->flags & CORRAL_SPAWN_NO_CLONE3))
        return;
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) < 0)
        child_fail(c, CORRAL_STEP_SECCOMP, errno);
}

/* Raw syscalls: glibc's setuid family signals every thread of the process (setxid
 * broadcast), which is neither needed nor safe here.  Groups first: changing them needs the
 * CAP_SETGID that the uid change takes away. */
static void child_credentials(const struct child_ctx *c, const struct corral_spawn_args *a)
{
    if ((a->flags & CORRAL_SPAWN_SETGROUPS) &&
        syscall(SYS_setgroups, (size_t)a->n_groups, a->groups) < 0)
        child_fail(c, CORRAL_STEP_SETGROUPS, errno);
    if ((a->flags & CORRAL_SPAWN_SETGID) &&
        syscall(SYS_setresgid, a->gid, a->gid, a->gid) < 0)
        child_fail(c, CORRAL_STEP_SETGID, errno);
    child_bounding_set(c, a);
    child_ambient_prepare(c, a);
    if ((a->flags & CORRAL_SPAWN_SETUID) &&
        syscall(SYS_setresuid, a->uid, a->uid, a->uid) < 0)
        child_fail(c, CORRAL_STEP_SETUID, errno);
    child_ambient_raise(c, a);
}

/* Dispositions back to default (handlers make no sense after exec anyway, but signals the
 * supervisor ignores would be inherited: a task started with SIGTERM ignored could not be
 * stopped gracefully), except those the caller asks to start ignored (bit N-1 of
 * ``ignored``: what a shell gives a background job, or nohup, when corral itself got them
 * ignored). */
/* A child that leaves our process group drops what was sent to the group before it left:
 * the signals are blocked from the clone on, so a terminal's Ctrl-C to corral's foreground
 * group in that window stayed pending and killed the child when its mask was cleared, before
 * its exec (a keeper dead before it was armed; a task in its own group dead of a key that was
 * corral's).  Nobody else knows the child yet: whatever is pending was aimed at the group.
 * Ignoring a signal discards it; child_default_signals() sets the dispositions after. */
static void child_discard_pending(void)
{
    sigset_t pending;
    if (sigpending(&pending) < 0)
        return;
    for (int sig = 1; sig < _NSIG; sig++) {
        if (sig == SIGKILL || sig == SIGSTOP || sigismember(&pending, sig) != 1)
            continue;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_IGN;
        sigaction(sig, &sa, NULL);
    }
}

static void child_default_signals(unsigned long long ignored)
{
    for (int sig = 1; sig < _NSIG; sig++) {
        struct sigaction sa;
        if (sig == SIGKILL || sig == SIGSTOP)
            continue;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = (sig <= 64 && (ignored & (1ULL << (sig - 1)))) ? SIG_IGN : SIG_DFL;
        sigaction(sig, &sa, NULL);  /* EINVAL for the realtime signals glibc reserves */
    }
}

/* PATH candidates in order; as execvp does, a candidate that exists but cannot be run
 * (EACCES, ENOEXEC...) is what gets reported, not the ENOENT of a later one. */
static void __attribute__((noreturn)) child_exec(const struct child_ctx *c,
                                                 const struct corral_spawn_args *a)
{
    int saved = ENOENT;
    for (char *const *p = a->exec_paths; *p != NULL; p++) {
        execve(*p, a->argv, a->envp);
        if (errno != ENOENT && errno != ENOTDIR) {
            if (saved == ENOENT)
                saved = errno;
        }
    }
    child_fail(c, CORRAL_STEP_EXEC, saved);
}

/* The order is systemd's (exec_invoke()): namespaces and mounts while we are still root;
 * groups, the bounding set and the ambient preparation before the uid change; the working
 * directory as the new user; no_new_privs last before exec. */
static int child_main(void *arg)
{
    const struct child_ctx *c = arg;
    const struct corral_spawn_args *a = c->a;
    int err;

    /* Fallback path: join the leaf before doing anything else, so every later step, and
     * everything the command starts, is accounted to it.  "0" means the writing process. */
    if (c->procs_fd >= 0) {
        ssize_t n;
        do {
            n = write(c->procs_fd, "0", 1);
        } while (n < 0 && errno == EINTR);
        if (n < 0)
            child_fail(c, CORRAL_STEP_CGROUP, errno);
    }

    if ((a->flags & CORRAL_SPAWN_SETSID) && setsid() < 0)
        child_fail(c, CORRAL_STEP_SETSID, errno);
    else if ((a->flags & CORRAL_SPAWN_SETPGID) && setpgid(0, 0) < 0)
        child_fail(c, CORRAL_STEP_SETPGID, errno);
    if (a->flags & (CORRAL_SPAWN_SETSID | CORRAL_SPAWN_SETPGID))
        child_discard_pending();
    child_network(c, a);
    child_mounts(c, a);

    if ((err = child_install_std_fds(a)) != 0)
        child_fail(c, CORRAL_STEP_FDS, err);
    if ((err = child_close_other_fds(a)) != 0)
        child_fail(c, CORRAL_STEP_FDS, err);
    if ((err = child_number_fds((struct child_ctx *)c)) != 0)
        child_fail(c, CORRAL_STEP_FDS, err);
    /* After the fds (a low RLIMIT_NOFILE must not break our own dups), before the uid change
     * (raising a hard limit needs CAP_SYS_RESOURCE). */
    for (int i = 0; i < a->n_rlimits; i++) {
        struct rlimit rl = { (rlim_t)a->rlimits[i].soft, (rlim_t)a->rlimits[i].hard };
        if (setrlimit(a->rlimits[i].resource, &rl) < 0)
            child_fail_at(c, CORRAL_STEP_RLIMIT, errno, i);
    }
    /* A new session's leader takes fd 0 (a pseudo-terminal's slave) as its controlling
     * terminal, so that the terminal's job control and signals reach the task. */
    if ((a->flags & CORRAL_SPAWN_SETCTTY) && ioctl(0, TIOCSCTTY, 0) < 0)
        child_fail(c, CORRAL_STEP_CTTY, errno);
    child_default_signals(a->ignored_signals);
    child_no_clone3(c, a);
    child_credentials(c, a);

    /* After dropping privileges, so the cwd is checked as the user who will run in it. */
    if (a->cwd != NULL && chdir(a->cwd) < 0)
        child_fail(c, CORRAL_STEP_CHDIR, errno);
    if (a->umask >= 0)
        umask((mode_t)a->umask);
    if ((a->flags & CORRAL_SPAWN_NO_NEW_PRIVS) &&
        prctl(PR_SET_NO_NEW_PRIVS, 1UL, 0UL, 0UL, 0UL) < 0)
        child_fail(c, CORRAL_STEP_NO_NEW_PRIVS, errno);

    sigset_t none;
    sigemptyset(&none);
    if (sigprocmask(SIG_SETMASK, &none, NULL) < 0)
        child_fail(c, CORRAL_STEP_SIGNALS, errno);
    child_exec(c, a);
}

/* ---- the parent ------------------------------------------------------------------------ */

#if defined(__x86_64__)
/* clone3 with CLONE_VM on a private stack: the child must not return through our frames, so
 * it calls fn(arg) from assembly on its new stack and exits with its return value. */
static long clone3_on_stack(struct corral_clone_args *ca, int (*fn)(void *), void *arg)
{
    long ret;
    register long r_fn __asm__("r12") = (long)fn;
    register long r_arg __asm__("r13") = (long)arg;
    __asm__ volatile(
        "syscall\n\t"
        "testq %%rax, %%rax\n\t"
        "jnz 1f\n\t"
        "xorl %%ebp, %%ebp\n\t"  /* the child: outermost frame */
        "movq %%r13, %%rdi\n\t"
        "callq *%%r12\n\t"
        "movl %%eax, %%edi\n\t"
        "movl $60, %%eax\n\t"    /* SYS_exit */
        "syscall\n\t"
        "hlt\n"
        "1:\n\t"
        : "=a"(ret)
        : "0"((long)SYS_clone3), "D"(ca), "S"(sizeof *ca), "r"(r_fn), "r"(r_arg)
        : "rcx", "r11", "memory", "cc");
    return ret;
}
#define HAVE_CLONE3_ON_STACK 1
#endif

#ifndef HAVE_CLONE3_ON_STACK
static int read_report(int fd, struct child_report *rep)
{
    ssize_t n;
    do {
        n = read(fd, rep, sizeof *rep);
    } while (n < 0 && errno == EINTR);
    if (n == (ssize_t)sizeof *rep)
        return 1;   /* the child failed and said how */
    return 0;       /* EOF: the exec closed the pipe */
}
#endif

static void reap(int pidfd, int pid)
{
    siginfo_t si;
    int r;
    if (pidfd >= 0) {
        do {
            r = waitid((idtype_t)P_PIDFD, (id_t)pidfd, &si, WEXITED);
        } while (r < 0 && errno == EINTR);
    } else {
        do {
            r = waitpid(pid, NULL, 0);
        } while (r < 0 && errno == EINTR);
    }
}

static int spawn_clone3(const struct corral_spawn_args *a, struct corral_spawn_result *r,
                        struct child_ctx *c, struct child_report *rep)
{
    struct corral_clone_args ca;
    int pidfd = -1;
    long pid;

    memset(&ca, 0, sizeof ca);
    ca.flags = CLONE_PIDFD;
    ca.pidfd = (uint64_t)(uintptr_t)&pidfd;
    ca.exit_signal = SIGCHLD;
    if (a->cgroup_fd >= 0) {
        ca.flags |= CLONE_INTO_CGROUP;
        ca.cgroup = (uint64_t)a->cgroup_fd;
    }

#ifdef HAVE_CLONE3_ON_STACK
    (void)rep;  /* the child writes into c->report, which is rep */
    char stack[CHILD_STACK_SIZE] __attribute__((aligned(16)));
    ca.flags |= CLONE_VM | CLONE_VFORK;
    ca.stack = (uint64_t)(uintptr_t)stack;
    ca.stack_size = sizeof stack;
    c->report_fd = -1;
    pid = clone3_on_stack(&ca, child_main, c);
    if (pid < 0)
        return (int)pid;
    r->method = CORRAL_METHOD_CLONE3_VFORK;
#else
    int pipefd[2];
    if (pipe2(pipefd, O_CLOEXEC) < 0) {
        r->step = CORRAL_STEP_PREPARE;
        return -errno;
    }
    c->report_fd = pipefd[1];
    pid = syscall(SYS_clone3, &ca, sizeof ca);
    if (pid == 0)
        child_main(c);   /* never returns */
    int saved = errno;
    close(pipefd[1]);
    if (pid < 0) {
        close(pipefd[0]);
        return -saved;
    }
    if (read_report(pipefd[0], rep) == 0)
        rep->step = CORRAL_STEP_NONE;
    close(pipefd[0]);
    r->method = CORRAL_METHOD_CLONE3_FORK;
#endif
    r->pid = (int)pid;
    r->pidfd = pidfd;
    return 0;
}

static int spawn_vfork_join(const struct corral_spawn_args *a, struct corral_spawn_result *r,
                            struct child_ctx *c)
{
    /* Probe pidfd_open first: a child we could not hold by pidfd must never exist. */
    int self = (int)syscall(SYS_pidfd_open, getpid(), 0);
    if (self < 0) {
        r->step = CORRAL_STEP_PREPARE;
        return -errno;
    }
    close(self);
    if (a->cgroup_fd >= 0) {
        c->procs_fd = openat(a->cgroup_fd, "cgroup.procs", O_WRONLY | O_CLOEXEC);
        if (c->procs_fd < 0) {
            r->step = CORRAL_STEP_PREPARE;
            return -errno;
        }
    }
    c->report_fd = -1;

    pid_t pid = vfork();
    if (pid == 0)
        child_main(c);   /* never returns */
    int saved = errno;
    if (c->procs_fd >= 0)
        close(c->procs_fd);
    if (pid < 0)
        return -saved;

    r->method = CORRAL_METHOD_VFORK_JOIN;
    r->pid = pid;
    /* Not yet reaped, so the pid cannot have been reused. */
    r->pidfd = (int)syscall(SYS_pidfd_open, pid, 0);
    if (r->pidfd < 0) {
        saved = errno;
        kill(pid, SIGKILL);
        reap(-1, pid);
        r->step = CORRAL_STEP_PIDFD;
        return -saved;
    }
    return 0;
}

/* Our memory's dumpable flag, across spawns that run at once.  A child that shares our memory
 * and changes its credentials makes that memory not dumpable (commit_creds()), which is what
 * keeps a process of the task's user from ptrace-attaching to it, or reading and writing it
 * through /proc/PID/mem or process_vm_writev(2), before it execs: our memory, root's.  The
 * flag is given back (no core dumps and a root-owned /proc/self otherwise, for no reason of
 * ours) only once no spawn at all is in flight: spawns run at once in several threads (the
 * event loop's, and workers' for a child another uid could stop before its exec while the
 * spawning thread waits for it), and one that gave it back at its own end would give it back
 * while another's child still shares our memory under a user's uid.  The lock guards the
 * count and the flag, never a spawn. */
static pthread_mutex_t dumpable_lock = PTHREAD_MUTEX_INITIALIZER;
static int spawns_in_flight;
static int dumpable_before;  /* PR_GET_DUMPABLE when the first of them began */

static void spawn_begins(void)
{
    pthread_mutex_lock(&dumpable_lock);
    if (spawns_in_flight++ == 0)
        dumpable_before = prctl(PR_GET_DUMPABLE, 0UL, 0UL, 0UL, 0UL);
    pthread_mutex_unlock(&dumpable_lock);
}

static void spawn_ends(void)
{
    pthread_mutex_lock(&dumpable_lock);
    if (--spawns_in_flight == 0 && dumpable_before == 1 &&
            prctl(PR_GET_DUMPABLE, 0UL, 0UL, 0UL, 0UL) != 1)
        prctl(PR_SET_DUMPABLE, 1UL, 0UL, 0UL, 0UL);
    pthread_mutex_unlock(&dumpable_lock);
}

int corral_spawn(const struct corral_spawn_args *a, struct corral_spawn_result *r)
{
    struct child_report rep = { CORRAL_STEP_NONE, 0, 0 };
    struct child_ctx c = { a, &rep, -1, -1 };
    sigset_t all, old;
    int ret = -ENOSYS;

    memset(r, 0, sizeof *r);
    r->pid = -1;
    r->pidfd = -1;

    spawn_begins();
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);

    if (!(a->flags & CORRAL_SPAWN_FORCE_FALLBACK)) {
        ret = spawn_clone3(a, r, &c, &rep);
        /* ENOSYS: no clone3 (< 5.3) or a seccomp filter; E2BIG/EINVAL: no CLONE_INTO_CGROUP
         * (< 5.7); EPERM: seccomp profiles that refuse what they do not know. */
        if (ret == -ENOSYS || ret == -EINVAL || ret == -E2BIG || ret == -EPERM)
            r->fallback_errno = -ret;
    } else {
        r->fallback_errno = ENOSYS;
    }
    if (r->fallback_errno != 0 && r->step == CORRAL_STEP_NONE)
        ret = spawn_vfork_join(a, r, &c);

    spawn_ends();
    pthread_sigmask(SIG_SETMASK, &old, NULL);

    if (ret < 0) {
        if (r->step == CORRAL_STEP_NONE)
            r->step = CORRAL_STEP_CLONE;
        r->err = -ret;
        return ret;
    }
    if (rep.step != CORRAL_STEP_NONE) {
        /* The child is gone or going: reap it so that no zombie remains. */
        reap(r->pidfd, r->pid);
        close(r->pidfd);
        r->pid = -1;
        r->pidfd = -1;
        r->step = rep.step;
        r->err = rep.err;
        r->index = rep.index;
        return -rep.err;
    }
    return 0;
}

int corral_inotify_init(void)
{
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int corral_inotify_add_watch(int fd, const char *path, unsigned int mask)
{
    int wd = inotify_add_watch(fd, path, mask);
    return wd < 0 ? -errno : wd;
}

int corral_inotify_rm_watch(int fd, int wd)
{
    return inotify_rm_watch(fd, wd) < 0 ? -errno : 0;
}

int corral_signalfd(const int *signals, int n)
{
    sigset_t set;
    sigemptyset(&set);
    for (int i = 0; i < n; i++)
        if (sigaddset(&set, signals[i]) < 0)
            return -errno;
    int fd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    return fd < 0 ? -errno : fd;
}

int corral_unshare(int flags)
{
    return unshare(flags) < 0 ? -errno : 0;
}

int corral_setns(int fd, int nstype)
{
    return setns(fd, nstype) < 0 ? -errno : 0;
}

int corral_shares_our_memory(int pid)
{
    long r = syscall(SYS_kcmp, (pid_t)getpid(), (pid_t)pid, KCMP_VM, 0UL, 0UL);
    if (r < 0)
        return -errno;
    return r == 0;
}

long corral_split_strings(const char *blob, unsigned long size, char **out, unsigned long n)
{
    unsigned long at = 0;
    for (unsigned long i = 0; i < n; i++) {
        const char *end = memchr(blob + at, '\0', size - at);
        if (at >= size || end == NULL)
            return -EINVAL;
        out[i] = (char *)blob + at;
        at = (unsigned long)(end - blob) + 1;
    }
    out[n] = NULL;
    return (long)at;
}
