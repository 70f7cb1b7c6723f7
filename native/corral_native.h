/* corral's native helper: spawn a child straight into a cgroup v2 leaf and hand back a pidfd.
 *
 * Every function returns 0 or a positive value on success and -errno on failure; nothing here
 * prints, allocates on the heap or calls back into Python.  The cffi build script
 * (build_native.py) feeds this header's declarations to cffi, so keep it plain C that cffi's
 * parser understands: no macros with expressions, no includes.
 */
#ifndef CORRAL_NATIVE_H
#define CORRAL_NATIVE_H

/* flags for corral_spawn_args.flags */
#define CORRAL_SPAWN_SETSID          1
#define CORRAL_SPAWN_NEWNET          2
#define CORRAL_SPAWN_SETGROUPS       4
#define CORRAL_SPAWN_SETGID          8
#define CORRAL_SPAWN_SETUID          16
#define CORRAL_SPAWN_FORCE_FALLBACK  32
#define CORRAL_SPAWN_SETCTTY         64  /* make fd 0 (a terminal) the controlling terminal: needs SETSID */
#define CORRAL_SPAWN_SETNS           128  /* join the network namespace netns_fd (instead of NEWNET) */
#define CORRAL_SPAWN_NEWNS           256  /* own mount namespace, propagation from the host only (slave) */
#define CORRAL_SPAWN_NO_NEW_PRIVS    512  /* PR_SET_NO_NEW_PRIVS just before exec */
#define CORRAL_SPAWN_CAPBSET         1024 /* drop cap_bset_drop's bits from the bounding set */
#define CORRAL_SPAWN_AMBIENT         2048 /* raise cap_ambient's bits as ambient capabilities */
#define CORRAL_SPAWN_SETPGID         4096 /* a process group of its own (setpgid(0, 0)) */
#define CORRAL_SPAWN_NO_CLONE3       8192 /* seccomp: clone3 answers ENOSYS (no CLONE_INTO_CGROUP) */

/* how the child was created (corral_spawn_result.method) */
#define CORRAL_METHOD_CLONE3_VFORK   1  /* clone3(CLONE_INTO_CGROUP|CLONE_PIDFD|CLONE_VM|CLONE_VFORK) */
#define CORRAL_METHOD_CLONE3_FORK    2  /* clone3(CLONE_INTO_CGROUP|CLONE_PIDFD), copy-on-write */
#define CORRAL_METHOD_VFORK_JOIN     3  /* vfork; the child writes itself into cgroup.procs; pidfd_open */

/* the step that failed (corral_spawn_result.step) */
#define CORRAL_STEP_NONE       0
#define CORRAL_STEP_PREPARE    1   /* parent: opening cgroup.procs, probing pidfd_open, pipe */
#define CORRAL_STEP_CLONE      2   /* parent: clone3 / vfork */
#define CORRAL_STEP_PIDFD      3   /* parent: pidfd_open after vfork */
#define CORRAL_STEP_CGROUP     4   /* child: joining the cgroup (fallback path) */
#define CORRAL_STEP_SETSID     5
#define CORRAL_STEP_NETNS      6
#define CORRAL_STEP_RLIMIT     7
#define CORRAL_STEP_FDS        8
#define CORRAL_STEP_SIGNALS    9
#define CORRAL_STEP_SETGROUPS  10
#define CORRAL_STEP_SETGID     11
#define CORRAL_STEP_SETUID     12
#define CORRAL_STEP_CHDIR      13
#define CORRAL_STEP_EXEC       14
#define CORRAL_STEP_CTTY       15
#define CORRAL_STEP_LOOPBACK   16  /* bringing "lo" up in the new network namespace */
#define CORRAL_STEP_MOUNTNS    17  /* unshare(CLONE_NEWNS), then / made a slave (recursively) */
#define CORRAL_STEP_TMPFS      18  /* a tmpfs on tmpfs_paths[index] */
#define CORRAL_STEP_READONLY   19  /* read-only remount of readonly_paths[index] */
#define CORRAL_STEP_CAPBSET    20  /* PR_CAPBSET_DROP of capability index */
#define CORRAL_STEP_CAPS       21  /* inheritable set and keep-caps, before the uid change */
#define CORRAL_STEP_AMBIENT    22  /* PR_CAP_AMBIENT_RAISE of capability index */
#define CORRAL_STEP_NO_NEW_PRIVS 23
#define CORRAL_STEP_SETPGID    24
#define CORRAL_STEP_SECCOMP    25  /* installing the NO_CLONE3 filter */

#define CORRAL_MAX_NUMBERED_FDS 16

struct corral_rlimit {
    int resource;
    unsigned long long soft;
    unsigned long long hard;
};

struct corral_spawn_args {
    char *const *exec_paths;   /* NULL-terminated candidates, tried in order (PATH search) */
    char *const *argv;         /* NULL-terminated */
    char *const *envp;         /* NULL-terminated */
    int cgroup_fd;             /* O_DIRECTORY fd of the leaf; -1: stay in our own cgroup */
    int stdin_fd;              /* installed as 0, 1, 2; each must be a valid fd */
    int stdout_fd;
    int stderr_fd;
    const int *pass_fds;       /* further fds kept open across exec, at the same numbers */
    int n_pass_fds;
    const char *cwd;           /* NULL: inherit */
    int umask;                 /* -1: inherit */
    unsigned int flags;        /* CORRAL_SPAWN_* */
    const unsigned int *groups;
    int n_groups;
    unsigned int gid;
    unsigned int uid;
    const struct corral_rlimit *rlimits;
    int n_rlimits;
    int netns_fd;              /* with CORRAL_SPAWN_SETNS: an fd of /proc/PID/ns/net or similar */
    char *const *tmpfs_paths;  /* with CORRAL_SPAWN_NEWNS: a fresh tmpfs (mode 1777) on each */
    int n_tmpfs;
    char *const *readonly_paths;           /* with CORRAL_SPAWN_NEWNS: mount points remounted */
    const unsigned long *readonly_flags;   /* read-only, keeping these MS_* flags of each */
    int n_readonly;
    int cap_last;                          /* the kernel's highest capability number */
    unsigned long long cap_bset_drop;      /* bit N: drop capability N from the bounding set */
    unsigned long long cap_ambient;        /* bit N: capability N ambient (kept across exec) */
    unsigned long long ignored_signals;    /* bit N-1: signal N starts ignored (as nohup) */
    const int *numbered_fds;   /* given to the task as fds 3, 4, ... in this order (not with */
    int n_numbered_fds;        /* pass_fds); at most CORRAL_MAX_NUMBERED_FDS */
};

struct corral_spawn_result {
    int pid;
    int pidfd;
    int method;          /* CORRAL_METHOD_* */
    int step;            /* CORRAL_STEP_* that failed, CORRAL_STEP_NONE on success */
    int err;             /* errno of the failed step */
    int index;           /* which path, rlimit or capability of that step failed (else 0) */
    int fallback_errno;  /* why clone3 was not used (ENOSYS, EINVAL, EPERM...), 0 if it was */
};

/* Spawn: 0 on success (pid, pidfd, method filled in), -errno on failure (step, err filled in).
 * A child that fails before execve has been reaped when this returns.  Any thread, several at
 * once (our memory's dumpable flag is given back once none is in flight: corral_native.c). */
int corral_spawn(const struct corral_spawn_args *args, struct corral_spawn_result *result);

/* inotify, which Python 3.11's stdlib lacks: -errno on failure. */
int corral_inotify_init(void);
int corral_inotify_add_watch(int fd, const char *path, unsigned int mask);
int corral_inotify_rm_watch(int fd, int wd);

/* signalfd for the signals listed (they must already be blocked in every thread): a
 * non-blocking, close-on-exec fd whose reads give struct signalfd_siginfo (128 bytes: signo,
 * errno, code, pid, uid, ...), so that a reader can tell who sent a signal (si_code SI_USER
 * from kill(2), SI_KERNEL from a terminal's Ctrl-C).  -errno on failure. */
int corral_signalfd(const int *signals, int n);

/* unshare(2) and setns(2) for the calling thread, which Python 3.11's os lacks (a probe of
 * whether namespaces may be made; a thread that joins a task's network namespace to look at
 * it).  -errno on failure. */
int corral_unshare(int flags);
int corral_setns(int fd, int nstype);

/* Whether process pid shares our address space (kcmp(2) KCMP_VM): 1 yes (a child of a
 * CLONE_VM spawn that has not exec'd yet), 0 no, -errno on failure. */
int corral_shares_our_memory(int pid);

/* Points out[0..n-1] at the n NUL-terminated strings that lie one after another in blob,
 * and out[n] at NULL (an argv or envp of any size from one buffer, without a Python object
 * per string).  Returns the bytes read, or -EINVAL if blob's size ends before the n-th. */
long corral_split_strings(const char *blob, unsigned long size, char **out, unsigned long n);

#endif
