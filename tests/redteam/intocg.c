/* intocg DIR CMD [ARGS...]: start CMD born in the cgroup directory DIR, with
 * clone3(CLONE_INTO_CGROUP), print its pid and exit without waiting for it.
 *
 * The red-team tests use it as a task would: any root program can open a cgroup directory
 * (O_RDONLY works on a read-only mount) and clone into it. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

struct clone_args_v2 {
    uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls,
        set_tid, set_tid_size, cgroup;
};

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: intocg DIR CMD [ARGS...]\n");
        return 2;
    }
    int fd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    struct clone_args_v2 a;
    memset(&a, 0, sizeof a);
    a.flags = 0x200000000ULL; /* CLONE_INTO_CGROUP */
    a.exit_signal = SIGCHLD;
    a.cgroup = (uint64_t)fd;
    long pid = syscall(435 /* SYS_clone3 */, &a, sizeof a);
    if (pid < 0) {
        perror("clone3");
        return 1;
    }
    if (pid == 0) {
        execvp(argv[2], argv + 2);
        _exit(127);
    }
    printf("%ld\n", pid);
    return 0;
}
