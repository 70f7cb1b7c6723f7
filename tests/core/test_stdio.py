"""A task's stdin as a live pipe, and a task on its own pseudo-terminal (tty=True)."""

from __future__ import annotations

import functools
import os
import termios

import pytest
import trio
from sup_util import HANG, wait_for

import supervisor


async def test_stdin_pipe_is_fed_while_the_task_runs_and_closed_on_request(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["cat"], stdin="pipe"))
        await task.write_stdin(b"one ")
        await wait_for(lambda: task.output().total == 4, what="the first write echoed")
        await task.write_stdin(b"two")
        task.close_stdin()
        task.close_stdin()  # idempotent
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "succeeded" and r.stdout == b"one two"
    with pytest.raises(BrokenPipeError):
        await task.write_stdin(b"late")


async def test_writing_more_than_the_buffer_waits_for_the_task_to_read(
        sup: supervisor.Supervisor) -> None:
    size = 8 << 20  # more than the pipe and the queue together
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["wc", "-c"], stdin="pipe"))
        with trio.fail_after(HANG):
            for _ in range(size >> 16):
                await task.write_stdin(b"x" * (1 << 16))
            task.close_stdin()
            r = await task.wait()
    assert r.stdout.strip() == str(size).encode()


async def test_writes_waiting_together_for_the_buffer_all_get_written(
        sup: supervisor.Supervisor) -> None:
    # found by an independent attack on the daemon: a second write while the first waited for
    # room failed with "Trio events cannot be treated as bools" (a 500 for a tenant)
    gate = "sleep 0.5; wc -c"  # (reads nothing for half a second: the writes wait)
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", gate], stdin="pipe"))
        await task.write_stdin(b"x" * (3 << 20 >> 1))  # (the queue over its MiB: writes wait)
        with trio.fail_after(HANG):
            async with trio.open_nursery() as writers:
                for _ in range(3):
                    writers.start_soon(task.write_stdin, b"y" * (1 << 20))
            task.close_stdin()
            r = await task.wait()
    assert r.outcome == "succeeded", r
    assert int(r.stdout) == (3 << 20 >> 1) + (3 << 20), r.stdout


async def test_a_task_that_closes_its_stdin_makes_writes_fail_not_the_task(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", "exec 0<&-; sleep 60"],
                                               stdin="pipe"))
        with trio.fail_after(HANG):
            with pytest.raises(BrokenPipeError):
                while True:
                    await task.write_stdin(b"y" * 65536)
        task.stop()
        r = await task.wait()
    assert r.outcome == "cancelled" and not any("stdin failed" in n for n in r.notes)


async def test_stdin_of_a_task_without_a_pipe_cannot_be_written(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(sup.start, ["sleep", "60"])
        with pytest.raises(supervisor.SpecError, match="stdin=\"pipe\""):
            await task.write_stdin(b"x")
        task.stop()


SPOIL_STDIN = ("import fcntl, os, sys; fcntl.fcntl(0, fcntl.F_SETFL, os.O_APPEND | os.O_NONBLOCK); "
               "sys.stdout.write(str(len(sys.stdin.buffer.read())))")


async def test_stdin_given_none_is_one_read_only_dev_null_no_task_can_spoil(
        sup: supervisor.Supervisor) -> None:
    # One /dev/null per supervisor serves every task's stdin: a task that changes its flags
    # (O_APPEND would make a splice into it fail) changes nothing for the next task, nor for
    # the output passed by unread to the reactor's own /dev/null.
    with trio.fail_after(HANG):
        first = await sup.run(["python3", "-c", SPOIL_STDIN])
        written = await sup.run(["sh", "-c", "echo x >&0"])
        big = await sup.run(["sh", "-c", "head -c 3000000 /dev/zero; cat; echo end"],
                            output_head=16, output_tail=16)
    assert first.outcome == "succeeded" and first.stdout == b"0", first
    assert written.outcome == "failed"  # read-only, as it always was
    assert big.outcome == "succeeded" and big.output_stdout.total == 3_000_004, big
    assert big.stdout.endswith(b"end\n")


async def test_a_tty_task_sees_a_terminal_and_its_output_is_captured(
        sup: supervisor.Supervisor) -> None:
    r = await sup.run(["sh", "-c", "test -t 0 && test -t 1 && test -t 2 && echo tty; "
                                   "echo to-stderr >&2; stty size"], tty=True,
                      tty_size=(33, 101))
    assert r.outcome == "succeeded"
    assert r.stdout == b"tty\r\nto-stderr\r\n33 101\r\n"  # the terminal's line discipline
    assert r.output_stdout.mode == "tty" and r.output_stderr.mode == "tty"


async def test_input_typed_into_a_tty_task_and_its_window_resized(
        sup: supervisor.Supervisor) -> None:
    script = ("echo ready; read line; echo got $line; "
              "trap 'echo winch $(stty size); exit 0' WINCH; echo armed; "
              "while :; do sleep 0.05; done")
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", script], tty=True))
        await wait_for(lambda: b"ready" in task.output().head, what="ready")
        await task.write_stdin(b"hello\n")
        await wait_for(lambda: b"armed" in task.output().head, what="the typed line read")
        task.resize(40, 120)
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "succeeded"
    assert b"got hello\r\n" in r.stdout and r.stdout.endswith(b"winch 40 120\r\n")


async def test_closing_a_tty_tasks_stdin_types_the_end_of_file_character(
        sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["cat"], tty=True))
        await task.write_stdin(b"a line\n")
        task.close_stdin()  # Ctrl-D at the start of a line: cat reads end of file
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "succeeded" and r.stdout == b"a line\r\na line\r\n"  # echo, cat


def test_a_tty_task_cannot_also_inherit_our_stdio() -> None:
    with pytest.raises(supervisor.SpecError, match="own terminal"):
        supervisor.TaskSpec(["true"], tty=True, stdout="inherit")
    with pytest.raises(supervisor.SpecError, match="tty_size"):
        supervisor.TaskSpec(["true"], tty_size=(24, 80))
    with pytest.raises(supervisor.SpecError, match="rows, columns"):
        supervisor.TaskSpec(["true"], tty=True, tty_size=(0, 80))


async def test_a_tap_gets_every_byte_in_order_and_holds_the_task_while_unread(
        sup: supervisor.Supervisor) -> None:
    size = 4 << 20  # far more than a tap holds unread
    script = (f'f=$(mktemp); head -c {size} /dev/urandom > "$f"; cat "$f"; '
              f'md5sum < "$f" >&2; rm "$f"')
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", f"{script}; echo done"]))
        tap = task.tap("stdout")
        await trio.sleep(0.3)  # nobody reads: the task must wait on its writes
        assert task.result is None
        got = bytearray()
        with trio.fail_after(HANG):
            async for chunk in tap:
                got += chunk
            r = await task.wait()
    assert r.outcome == "succeeded" and got.endswith(b"done\n")
    import hashlib
    digest = r.stderr.split()[0].decode()
    assert hashlib.md5(got[:-5]).hexdigest() == digest and len(got) == size + 5


async def test_a_tty_task_starts_with_the_modes_it_is_given(sup: supervisor.Supervisor) -> None:
    import termios

    r = await sup.run(["stty", "-a"], tty=True)
    modes = None
    assert b" echo " in r.stdout or r.stdout.startswith(b"echo")  # the default: echo on
    import os
    master, slave = os.openpty()
    try:
        modes = termios.tcgetattr(slave)
    finally:
        os.close(master)
        os.close(slave)
    modes[3] &= ~termios.ECHO  # lflag: no echo
    r = await sup.run(["stty", "-a"], tty=True, tty_modes=modes)
    assert b"-echo " in r.stdout


async def test_a_tap_asked_for_at_the_start_misses_not_a_byte(sup: supervisor.Supervisor) -> None:
    async with trio.open_nursery() as n:  # the task writes before start() has returned
        task = await n.start(functools.partial(sup.start, ["echo", "first"], taps=["stdout"]))
        tap = task.tap("stdout")
        got = bytearray()
        with trio.fail_after(HANG):
            async for chunk in tap:
                got += chunk
            r = await task.wait()
    assert bytes(got) == b"first\n" and r.stdout == b"first\n"
    with pytest.raises(supervisor.SpecError, match="taps are"):
        sup.start(["true"], taps=["stdin"])


async def test_closing_stdin_types_the_end_of_file_character_the_terminal_has_now(
        sup: supervisor.Supervisor) -> None:
    script = "stty eof ^B; echo set; cat; echo after-cat; cat; echo done"
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-c", script], tty=True))
        await wait_for(lambda: b"set" in task.output().head, what="the new VEOF")
        modes = task.terminal_modes()
        assert modes is not None and modes[6][termios.VEOF] == b"\x02"
        task.close_stdin()  # ends the first cat
        await wait_for(lambda: b"after-cat" in task.output().head, what="the first cat's end")
        task.close_stdin()  # each call types it once more: ends the second
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "succeeded" and r.stdout.endswith(b"done\r\n")
    assert task.terminal_modes() is None


async def test_a_terminal_signal_reaches_the_foreground_program_not_the_shell(
        sup: supervisor.Supervisor) -> None:
    import signal

    # an interactive shell runs sleep in a foreground group of its own; Ctrl-C's SIGINT goes
    # to that group: sleep dies, the shell abandons its command line and prompts for the next
    async with trio.open_nursery() as n:
        task = await n.start(functools.partial(sup.start, ["sh", "-ic", "sleep 60"], tty=True,
                                               env={"PS1": "prompt> "}))
        await wait_for(lambda: task.terminal_foreground() not in (None, task.pid),
                       what="sleep in the foreground")
        assert task.terminal_signal(signal.SIGINT)
        await wait_for(lambda: b"prompt> " in task.output().head, what="the shell's prompt")
        await task.write_stdin(b"echo shell-lives $?; exit\n")
        with trio.fail_after(HANG):
            r = await task.wait()
    assert r.outcome == "succeeded" and b"shell-lives 130" in r.stdout
    assert not task.terminal_signal(signal.SIGINT)  # ended: nothing to signal
    async with trio.open_nursery() as n:
        plain = await n.start(sup.start, ["true"])
        with pytest.raises(supervisor.SpecError, match="tty=True"):
            plain.terminal_signal(signal.SIGINT)


async def test_pass_fds_gives_the_task_those_fds_as_3_4_and_no_other(
        sup: supervisor.Supervisor) -> None:
    r, w = os.pipe2(os.O_CLOEXEC)
    r2, w2 = os.pipe2(os.O_CLOEXEC)
    other_r, other_w = os.pipe()  # (inheritable, not passed: closed at the exec all the same)
    try:
        # dash takes single-digit fd numbers only: the fds are given as 3 and 4
        result = await sup.run(["sh", "-c", "echo side >&3; echo two >&4; ls /proc/self/fd"],
                               pass_fds=[w, w2])
        os.close(w)
        os.close(w2)
        assert (os.read(r, 100), os.read(r2, 100)) == (b"side\n", b"two\n")
        fds = {int(n) for n in result.stdout.split()}
        assert fds == {0, 1, 2, 3, 4, 5}  # (5: the directory ls reads)
    finally:
        for fd in (r, r2, other_r, other_w):
            os.close(fd)
    with pytest.raises(supervisor.SpecError, match="pass_fds must be a list of at most 16"):
        supervisor.TaskSpec(["true"], pass_fds=[3] * 17)
