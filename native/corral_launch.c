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
 * The interpreter, the first of these that execs:
 *   1. CORRAL_PYTHON, the one it was built for (baked in by setup.py: pip builds with the
 *      interpreter it installs for);
 *   2. python3 beside this launcher (the directory of /proc/self/exe, so through any symlink:
 *      the same virtualenv's bin/), right for a wheel built with another interpreter path;
 *   3. python3 on PATH, right only if it can import supervisor: otherwise it is another
 *      environment's Python (the system's, when a virtualenv was moved or deleted).
 * Whether an interpreter is corral's is known only once it runs, so CODE checks: an ImportError
 * of supervisor.cli is one line on stderr and status 125 (corral's own failure), never a
 * traceback.  The line names each candidate that did not exec with its OS error, then the
 * interpreter that ran (sys.executable) with its ImportError, then the fix; when none execs, the
 * launcher prints the same line itself.  The failures reach Python inside CODE (hex, decoded
 * only on that error path), not in the environment a task would inherit nor in sys.argv.  An
 * ImportError inside corral (a broken install) reads the same way and has the same fix.  `-P`
 * keeps the working directory off sys.path (a `supervisor/` directory there must not be
 * imported instead).
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

#define FIX "reinstall corral in its virtualenv (python3 -m venv DIR && DIR/bin/pip install " \
            "corral) or run DIR/bin/corral of the right environment"

/* sys.argv is ["-c", CORRAL, ARGS...]: dropping "-c" leaves what a script would have, and
 * /proc/PID/cmdline still names the command (ps, pgrep -f).  The success path runs what it
 * always did, plus a try (free since Python 3.11); the failed candidates go between the two
 * halves, in hex.  No quote, brace or backslash in FIX: it is inside a Python f-string. */
static const char CODE_HEAD[] = "import sys\n"
                                "del sys.argv[0]\n"
                                "try:\n"
                                " from supervisor.cli import main\n"
                                "except ImportError as e:\n"
                                " t = bytes.fromhex('";
static const char CODE_TAIL[] = "').decode(errors='replace')\n"
                                " sys.stderr.write(f'corral: cannot start its Python: {t}"
                                "{sys.executable}: cannot import supervisor.cli: {e}; " FIX
                                "\\n')\n"
                                " sys.exit(125)\n"
                                "sys.exit(main())";

/* The same list as JOB_SIGNALS in supervisor/cli/terminal.py. */
static const int JOB_SIGNALS[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGWINCH, SIGCONT };

/* Appends "WHAT: strerror(err); " to the string failed (of size bytes), truncating. */
static void note(char *failed, size_t size, const char *what, int err)
{
    size_t len = strlen(failed);
    snprintf(failed + len, size - len, "%s: %s; ", what, strerror(err));
}

/* CODE_HEAD, failed in hex, CODE_TAIL, malloc'd; exits 125 if out of memory. */
static char *code(const char *failed)
{
    size_t n = strlen(failed);
    char *s = malloc(sizeof CODE_HEAD + 2 * n + sizeof CODE_TAIL);
    if (s == NULL) {
        fputs("corral: out of memory\n", stderr);
        exit(125);
    }
    char *p = stpcpy(s, CODE_HEAD);
    for (size_t i = 0; i < n; i++)
        p += sprintf(p, "%02x", (unsigned char)failed[i]);
    strcpy(p, CODE_TAIL);
    return s;
}

/* Execs python (a path) on args with a CODE that knows the failures so far; returns only if
 * that failed, having appended the path and the reason to failed. */
static void run(const char *python, char **args, char *failed, size_t size)
{
    args[0] = (char *)python;
    args[3] = code(failed);
    execv(python, args);
    int err = errno;
    free(args[3]);
    note(failed, size, python, err);
}

/* Puts "DIR/python3" into path for this launcher's directory; 0, or -1 with errno set. */
static int beside_self(char *path, size_t size)
{
    ssize_t n = readlink("/proc/self/exe", path, size - sizeof "/python3");
    if (n < 0)
        return -1;
    if ((size_t)n >= size - sizeof "/python3") {
        errno = ENAMETOOLONG;
        return -1;
    }
    path[n] = '\0';
    char *slash = strrchr(path, '/');
    if (slash == NULL) {
        errno = ENOENT;
        return -1;
    }
    strcpy(slash, "/python3");
    return 0;
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
    for (int i = 0; i < argc; i++)
        args[4 + i] = argv[i];

    char failed[3 * PATH_MAX] = "";
    run(CORRAL_PYTHON, args, failed, sizeof failed);

    char beside[PATH_MAX];
    if (beside_self(beside, sizeof beside) < 0)
        note(failed, sizeof failed, "python3 beside corral: /proc/self/exe", errno);
    else if (strcmp(beside, CORRAL_PYTHON) != 0)
        run(beside, args, failed, sizeof failed);

    const char *path = getenv("PATH");
    char on_path[PATH_MAX];
    snprintf(on_path, sizeof on_path, "python3 on PATH (%s)", path != NULL ? path : "unset");
    args[0] = "python3";
    args[3] = code(failed);
    execvp("python3", args);
    note(failed, sizeof failed, on_path, errno);
    fprintf(stderr, "corral: cannot start its Python: %s" FIX "\n", failed);
    return 125;
}
