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
};

struct corral_spawn_result {
    int pid;
    int pidfd;
    int method;          /* CORRAL_METHOD_* */
    int step;            /* CORRAL_STEP_* that failed, CORRAL_STEP_NONE on success */
    int err;             /* errno of the failed step */
    int fallback_errno;  /* why clone3 was not used (ENOSYS, EINVAL, EPERM...), 0 if it was */
};

/* Spawn: 0 on success (pid, pidfd, method filled in), -errno on failure (step, err filled in).
 * A child that fails before execve has been reaped when this returns. */
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

#endif
