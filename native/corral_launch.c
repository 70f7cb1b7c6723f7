/* corral: the command's launcher.  Blocks the terminal's and the service manager's signals,
 * then execs Python on supervisor.cli.
 *
 * Why: CPython installs its SIGINT handler while it starts, long before any code of ours can
 * run (site, the editable-install finder, the console script's imports: 15-50 ms).  A Ctrl-C in
 * that window was a KeyboardInterrupt with a traceback.  Blocked signals survive execve, and
 * Python leaves the mask alone, so a key pressed while Python starts stays pending: `corral run`
 * reads it from its signalfd like any other (before the spawn: the task never starts, the
 * record says so); every other verb unblocks them at once (supervisor/cli/__init__.py) and so
 * behaves as a plain Python program would.  CORRAL_LAUNCHER=1 tells Python the mask is ours.
 *
 * The interpreter: the one it was built for (CORRAL_PYTHON, baked in by setup.py: pip builds
 * with the interpreter it installs for), else python3 beside this launcher (a virtualenv's bin/,
 * for a wheel built elsewhere), else python3 on PATH.  `-P` keeps the working
 * directory off sys.path (a `supervisor/` directory there must not be imported instead).
 */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#ifndef CORRAL_PYTHON
#define CORRAL_PYTHON "/usr/bin/python3"
#endif

/* sys.argv is ["-c", CORRAL, ARGS...]: dropping "-c" leaves what a script would have, and
 * /proc/PID/cmdline still names the command (ps, pgrep -f) */
static const char CODE[] = "import sys; del sys.argv[0]; from supervisor.cli import main; "
                           "sys.exit(main())";

/* The same list as JOB_SIGNALS in supervisor/cli/terminal.py. */
static const int JOB_SIGNALS[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGWINCH, SIGCONT };

static void run(const char *python, char **args)
{
    args[0] = (char *)python;
    execv(python, args);
}

int main(int argc, char **argv)
{
    sigset_t set;
    sigemptyset(&set);
    for (size_t i = 0; i < sizeof JOB_SIGNALS / sizeof JOB_SIGNALS[0]; i++)
        sigaddset(&set, JOB_SIGNALS[i]);
    sigprocmask(SIG_BLOCK, &set, NULL);
    setenv("CORRAL_LAUNCHER", "1", 1);

    /* python -P -c CODE CORRAL ARGS... */
    char **args = calloc((size_t)argc + 5, sizeof *args);
    if (args == NULL) {
        fputs("corral: out of memory\n", stderr);
        return 125;
    }
    args[1] = "-P";
    args[2] = "-c";
    args[3] = (char *)CODE;
    for (int i = 0; i < argc; i++)
        args[4 + i] = argv[i];

    run(CORRAL_PYTHON, args);
    char beside[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", beside, sizeof beside - sizeof "/python3");
    if (n > 0) {
        beside[n] = '\0';
        char *slash = strrchr(beside, '/');
        if (slash != NULL) {
            strcpy(slash, "/python3");
            if (access(beside, X_OK) == 0)
                run(beside, args);
        }
    }
    args[0] = "python3";
    execvp("python3", args);
    fprintf(stderr, "corral: cannot start Python (%s, python3 beside %s, or on PATH): "
            "%s; reinstall corral in a virtualenv (python3 -m venv ...; pip install .)\n",
            CORRAL_PYTHON, argc > 0 ? argv[0] : "corral", strerror(errno));
    return 125;
}
