"""corral mcp driven by the SDK's client over stdio: tools and schemas, sessions, the wait
bound, output paging, signals and stops to the whole tree, cancellation, stdin EOF."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from mcp_util import HANG, Host, assert_nothing_left, open_host

import cgroupfs

TOOLS = {"run", "output", "input", "signal", "stop", "list", "new_session", "close_session"}


async def test_tools_are_listed_with_valid_schemas_and_the_policy(host: Host) -> None:
    assert set(host.tools) == TOOLS
    for tool in host.tools.values():
        for schema in (tool.input_schema, tool.output_schema):
            assert schema is not None and schema["type"] == "object"
            jsonschema.Draft202012Validator.check_schema(schema)
        assert tool.description
    run = host.tools["run"].description or ""
    for words in ("ceiling 10min", "cgroup controllers", "timed_out", "oom_killed",
                  "spawn_failed", "lost", "wait"):
        assert words in run, words
    if host.backend == "daemon":
        assert "the corral serve daemon" in host.instructions
        assert "tasks outlive this server" in host.instructions
    else:
        assert "in-process" in host.instructions
        assert "ends when this server exits" in host.instructions


async def test_cd_export_unset_carry_and_a_failing_command_carries_too(host: Host,
                                                                        tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    first = await host.run(f"cd {tmp_path} && export A=1 B=2 && echo here")
    assert first["outcome"] == "succeeded" and first["stdout"]["head"] == "here\n"
    assert first["carried"] == {"cwd": str(tmp_path), "set": ["A", "B"], "unset": []}
    second = await host.run("cd sub; unset B; export C=3; false")
    assert second["outcome"] == "failed" and second["exit_code"] == 1
    assert second["carried"] == {"cwd": str(tmp_path / "sub"), "set": ["C"], "unset": ["B"]}
    third = await host.run('pwd; echo "$A-${B-unset}-$C"')
    assert third["stdout"]["head"] == f"{tmp_path / 'sub'}\n1-unset-3\n"


async def test_a_timed_out_command_carries_nothing(host: Host, tmp_path: Path) -> None:
    await host.run(f"cd {tmp_path}")
    late = await host.run("cd / && export LATE=1 && sleep 30", time_limit="1s")
    assert late["outcome"] == "timed_out" and late["exit_status"] == 124
    assert "nothing" in late["carried"] and "timed_out" in late["carried"]["nothing"]
    after = await host.run('pwd; echo "${LATE-none}"')
    assert after["stdout"]["head"] == f"{tmp_path}\nnone\n"


async def test_the_wait_bound_answers_while_the_task_goes_on_then_stop_ends_it(
        host: Host) -> None:
    t0 = time.monotonic()
    answer = await host.run("sleep 30", wait=1)
    assert 0.9 < time.monotonic() - t0 < 3.0
    assert answer["state"] == "running" and answer["outcome"] is None
    assert "still running" in answer["note"]
    task_id = answer["task_id"]
    rows = (await host.call("list"))["tasks"]
    assert [r["state"] for r in rows if r["task_id"] == task_id] == ["running"]
    stopped = await host.call("stop", {"task_id": task_id})
    assert stopped["requested"] is True
    assert stopped["state"] == "finished" and stopped["outcome"] == "cancelled"
    assert stopped["stop"] == "cancel: signalled" and stopped["cleanup"] == "clean"


async def test_progress_is_notified_while_a_run_waits(host: Host) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def progress(done: float, total: float | None, message: str | None) -> None:
        seen.append((done, total, message))

    answer = await host.call("run", {"command": "sleep 30", "wait": 2.5},
                             progress_callback=progress)
    assert answer["state"] == "running"
    assert len(seen) >= 2 and all(total == 2.5 for _, total, _ in seen)
    assert [d for d, _, _ in seen] == sorted(d for d, _, _ in seen)
    await host.call("stop", {"task_id": answer["task_id"], "force": True})


async def test_a_cancelled_run_request_stops_its_task_and_it_is_recorded(host: Host) -> None:
    with trio.move_on_after(1.0):
        await host.run("echo started; sleep 30", wait=30)
        raise AssertionError("the run answered before it was cancelled")
    with trio.fail_after(HANG):
        while not (rows := (await host.call("list"))["tasks"]):
            await trio.sleep(0.05)
    row = await host.wait_finished(rows[0]["task_id"], timeout=10)
    assert row["outcome"] == "cancelled"
    out = await host.call("output", {"task_id": row["task_id"]})
    assert out["text"] == "started\n" and out["eof"] is True


async def test_output_is_head_and_tail_with_the_dropped_count_and_pages_after_the_end(
        host: Host) -> None:
    expected = "".join(f"{i}\n" for i in range(1, 30001)).encode()
    answer = await host.run("seq 1 30000; echo oops >&2")
    out = answer["stdout"]
    assert out["total_bytes"] == len(expected)
    assert len(out["head"]) == len(out["tail"]) == 8192
    assert out["dropped_bytes"] == len(expected) - 2 * 8192
    assert (out["head"] + out["tail"]).encode() == expected[:8192] + expected[-8192:]
    assert answer["stderr"]["head"] == "oops\n"
    got, offset = b"", 0
    while True:
        page = await host.call("output", {"task_id": answer["task_id"], "offset": offset,
                                          "max_bytes": 65536})
        got += page["text"].encode()
        offset = page["next_offset"]
        if page["eof"]:
            break
    assert got == expected
    last = await host.call("output", {"task_id": answer["task_id"], "offset": -6})
    assert last["text"] == "30000\n" and last["offset"] == len(expected) - 6
    err = await host.call("output", {"task_id": answer["task_id"], "stream": "stderr"})
    assert err["text"] == "oops\n"


async def test_stdin_is_empty_unless_given(host: Host) -> None:
    empty = await host.run("cat; echo end", wait=10)
    assert empty["outcome"] == "succeeded" and empty["stdout"]["head"] == "end\n"
    fed = await host.run("tr a-z A-Z", stdin="hello\n")
    assert fed["stdout"]["head"] == "HELLO\n"


async def test_an_interactive_command_takes_input_until_its_end(host: Host) -> None:
    # a program that asks: it waits for input, the model answers through the input tool
    asks = await host.run("echo 'name?'; read name; echo \"hello $name\"; read more; "
                          "echo \"then $more\"", interactive=True, stdin="first\n", wait=1)
    task_id = asks["task_id"]
    assert asks["state"] == "running" and asks["stdout"]["head"] == "name?\nhello first\n"
    typed = await host.call("input", {"task_id": task_id, "text": "last\n", "eof": True})
    assert typed == {"task_id": task_id, "written": 5, "eof": True, "state": typed["state"]}
    end = await host.call("output", {"task_id": task_id, "wait": HANG})
    assert end["text"] == "name?\nhello first\nthen last\n" and end["eof"]
    late = await host.call("input", {"task_id": task_id, "text": "x"}, error=True)
    assert "no more input" in late["text"]
    plain = await host.run("true")
    refused = await host.call("input", {"task_id": plain["task_id"], "text": "x"}, error=True)
    assert "interactive: true" in refused["text"]


async def test_closing_a_session_stops_what_runs_in_it(host: Host) -> None:
    s = await host.call("new_session", {})
    long = await host.run("sleep 600", session=s["session"], background=True)
    closed = await host.call("close_session", {"session": s["session"]})
    assert closed == {"session": s["session"], "stopped": [long["task_id"]]}
    ended = await host.call("output", {"task_id": long["task_id"], "wait": HANG})
    assert ended["eof"] and ended["state"] == "finished"
    gone = await host.call("run", {"command": "true", "session": s["session"]}, error=True)
    assert f"session {s['session']} is closed" in gone["text"]
    # the default session, closed, is made anew by the next run
    await host.run("cd /")
    await host.call("close_session", {"session": "default"})
    assert (await host.run("pwd"))["outcome"] == "succeeded"


async def test_signal_reaches_every_process_of_the_tree(host: Host) -> None:
    script = ("sh -c 'trap \"echo child-usr1\" USR1; while :; do sleep 0.05; done' & "
              "trap 'echo parent-usr1' USR1; while :; do sleep 0.05; done")
    answer = await host.run(script, background=True)
    assert answer["state"] == "running" and answer["waited_s"] < 1
    task_id = answer["task_id"]
    await trio.sleep(0.3)  # (both traps set: each shell prints a line when it has)
    sent = await host.call("signal", {"task_id": task_id, "signal": "USR1"})
    assert sent == {"task_id": task_id, "signal": "USR1", "sent": True, "state": "running"}
    with trio.fail_after(HANG):
        while True:
            text = (await host.call("output", {"task_id": task_id}))["text"]
            if "child-usr1" in text and "parent-usr1" in text:
                break
            await trio.sleep(0.05)
    stopped = await host.call("stop", {"task_id": task_id})
    assert stopped["outcome"] == "cancelled" and stopped["signals"][0]["signal"] == "USR1"
    assert stopped["carried"] == {"nothing": "a background command carries nothing over"}
    ended = await host.call("signal", {"task_id": task_id, "signal": "INT"}, error=True)
    assert "not running" in ended["text"]


async def test_stop_reaches_a_setsid_escapee(host: Host, test_cgroup: cgroupfs.Cgroup) -> None:
    answer = await host.run("setsid sleep 300 & sleep 300", wait=0.5)
    assert answer["state"] == "running"
    stopped = await host.call("stop", {"task_id": answer["task_id"], "force": True})
    assert stopped["outcome"] == "cancelled" and stopped["cleanup"] == "clean"
    procs = [p for ps in test_cgroup.procs_tree().values() for p in ps]
    assert procs == []
    left = await host.run("setsid sleep 300 & echo left it")
    # (one leftover, named by what it was when seen: sleep, or setsid or bash before exec)
    assert left["outcome"] == "succeeded" and len(left["leftovers"]) == 1
    assert left["leftovers"][0] in ("sleep", "setsid", "bash"), left["leftovers"]
    assert left["cleanup"] == "clean"


async def test_new_session_has_its_own_directory_and_environment(host: Host,
                                                                 tmp_path: Path) -> None:
    made = await host.call("new_session", {"cwd": str(tmp_path), "env": {"WHO": "second"}})
    assert made["cwd"] == str(tmp_path) and made["commands"] == 0
    sid = made["session"]
    inside = await host.run('pwd; echo "$WHO"; cd /', session=sid)
    assert inside["stdout"]["head"] == f"{tmp_path}\nsecond\n" and inside["session"] == sid
    default = await host.run('echo "${WHO-none}"')
    assert default["stdout"]["head"] == "none\n" and default["session"] == "default"
    listed = await host.call("list", {"session": sid})
    assert [t["task_id"] for t in listed["tasks"]] == [inside["task_id"]]
    assert listed["sessions"][0]["cwd"] == "/"


async def test_bad_input_is_an_error_and_runs_nothing(host: Host) -> None:
    for name, args, words in [
        ("run", {"command": "true", "session": "nope"}, "no session 'nope'"),
        ("run", {"command": "true", "time_limit": "-5s"}, "time_limit"),
        ("run", {"command": "true", "property": "MemoryMax=1G"}, "Additional properties"),
        ("run", {"command": ""}, "command"),
        ("run", {"command": "true", "wait": 10000}, "wait"),
        ("signal", {"task_id": "x", "signal": "KILL"}, "signal"),
        ("output", {"task_id": "nope"}, "no task 'nope'"),
        ("stop", {"task_id": "nope"}, "no task 'nope'"),
        ("new_session", {"cwd": "/does/not/exist"}, "not a directory"),
        ("new_session", {"env": {"A=B": "1"}}, "env name"),
    ]:
        text = (await host.call(name, args, error=True))["text"]
        assert words in text, (name, args, text)
    assert (await host.call("list"))["tasks"] == []


async def test_a_session_whose_directory_is_gone_says_so_and_a_cwd_moves_it(
        host: Host, tmp_path: Path) -> None:
    """A command that removed its own directory left its session there: every later command
    failed to start, and none could carry a way out.  Each says so, naming run's ``cwd``,
    which runs one elsewhere; the directory it leaves carries."""
    build = tmp_path / "build"
    build.mkdir()
    assert (await host.run(f"cd {build} && rmdir {build}"))["outcome"] == "succeeded"
    stuck = await host.run("pwd")
    assert stuck["outcome"] == "spawn_failed", stuck
    why = stuck["carried"]["nothing"]
    assert f'directory "{build}" cannot be entered (ENOENT)' in why and '"cwd"' in why, why
    moved = await host.run("pwd; cd /usr", cwd=str(tmp_path))
    assert moved["stdout"]["head"] == f"{tmp_path}\n" and moved["carried"]["cwd"] == "/usr"
    assert (await host.run("pwd"))["stdout"]["head"] == "/usr\n"
    text = (await host.call("run", {"command": "true", "cwd": str(build)}, error=True))["text"]
    assert "not a directory here" in text, text


async def test_a_spawn_failure_and_a_signal_death_are_data(host: Host, tmp_path: Path) -> None:
    gone = tmp_path / "gone"
    made = await host.call("new_session", {"cwd": str(gone.parent)})
    await host.run(f"mkdir {gone} && cd {gone}", session=made["session"])
    gone.rmdir()
    failed = await host.run("true", session=made["session"])
    assert failed["outcome"] == "spawn_failed" and failed["error"]
    killed = await host.run("kill -SEGV $$")
    assert killed["outcome"] == "signaled" and killed["exit_signal"] == "SIGSEGV"


async def test_the_ceiling_caps_a_longer_time_limit_and_properties_hold(
        backend: str, test_cgroup: cgroupfs.Cgroup, tmp_path: Path,
        request: pytest.FixtureRequest) -> None:
    socket = request.getfixturevalue("start_daemon")().socket if backend == "daemon" else None
    async with open_host(test_cgroup, tmp_path / "err", "--time-limit", "2s",
                         "--max-time-limit", "3s", "-p", "User=nobody", socket=socket) as h:
        description = h.tools["run"].description or ""
        assert "ceiling 3s" in description and "User=nobody" in description
        who = await h.run("cd /tmp && id -u")
        assert who["stdout"]["head"] == "65534\n"
        default = await h.run("true")
        assert default["time_limit_s"] == 2.0
        capped = await h.run("true", time_limit="1h")
        assert capped["time_limit_s"] == 3.0 and any("capped" in n for n in capped["notes"])
    if socket is None:
        assert_nothing_left(test_cgroup)


def test_bad_options_are_refused_before_anything_runs(test_cgroup: cgroupfs.Cgroup,
                                                     tmp_path: Path) -> None:
    for options, status, words in (
            (["--socket", str(tmp_path / "none.sock")], 1, "cannot reach the corral daemon"),
            (["--socket", "/x", "--local"], 2, "exclude each other"),
            (["--local", "-p", "Environment=A=1"], 2, "new_session takes env"),
            (["--local", "--time-limit=-5s"], 2, "positive duration")):
        root = [] if "--socket" in options else ["--cgroup-root", test_cgroup.path]
        done = subprocess.run([sys.executable, "-m", "supervisor.mcp", *root, *options],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=HANG, cwd="/")
        assert done.returncode == status and words in done.stderr, (options, done.stderr)
    assert_nothing_left(test_cgroup)


def _send(proc: subprocess.Popen[bytes], message: dict[str, Any]) -> None:
    assert proc.stdin is not None
    proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")
    proc.stdin.flush()


def _answer(proc: subprocess.Popen[bytes], request_id: int) -> dict[str, Any]:
    assert proc.stdout is not None
    while True:
        line = proc.stdout.readline()
        assert line, "the server closed its stdout"
        message = json.loads(line)
        if message.get("id") == request_id:
            return message  # type: ignore[no-any-return]


def _sleepers(cgroup: cgroupfs.Cgroup) -> int:
    count = 0
    for pids in cgroup.procs_tree().values():
        for pid in pids:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    count += f.read().strip() == "sleep"
            except FileNotFoundError:
                pass
    return count


def test_stdin_eof_stops_what_it_started_and_exits(test_cgroup: cgroupfs.Cgroup,
                                                   tmp_path: Path) -> None:
    """As a host that goes away: its end of our stdin closes with tasks still running (one
    in the background, one past its wait bound, one a request still waiting)."""
    with open(tmp_path / "err", "wb") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor.mcp", "--local", "--cgroup-root",
             test_cgroup.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err,
            cwd="/")
    try:
        _send(proc, {"id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "test", "version": "0"}}})
        assert "result" in _answer(proc, 1)
        _send(proc, {"method": "notifications/initialized"})
        for n, args in ((2, {"command": "setsid sleep 600 & sleep 600", "background": True}),
                        (3, {"command": "sleep 600", "wait": 0.2})):
            _send(proc, {"id": n, "method": "tools/call",
                         "params": {"name": "run", "arguments": args}})
            assert _answer(proc, n)["result"]["structuredContent"]["state"] == "running"
        _send(proc, {"id": 4, "method": "tools/call",
                     "params": {"name": "run", "arguments": {"command": "sleep 600"}}})
        deadline = time.monotonic() + HANG
        while _sleepers(test_cgroup) < 4:  # (the third's own request is waiting)
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert proc.stdin is not None
        proc.stdin.close()
        assert proc.wait(timeout=HANG) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert_nothing_left(test_cgroup)


MODEL_RUN = [
    ("mkdir -p demo/src && cd demo", None),
    ("git init -q . 2>/dev/null || true; pwd", "/demo\n"),
    ("printf 'def add(a, b):\\n    return a + b\\n' > src/calc.py && ls src", "calc.py\n"),
    ("cat > test_calc.py <<'EOF'\nfrom src.calc import add\nassert add(2, 3) == 5\n"
     "print('ok')\nEOF", None),
    ("touch src/__init__.py && python3 -B test_calc.py", "ok\n"),
    ("export PROJECT=demo GREETING='hi there'", None),
    ('echo "$PROJECT: $GREETING"', "demo: hi there\n"),
    ("grep -n return src/calc.py", "2:    return a + b\n"),
    ("sed -i 's/a + b/a - b/' src/calc.py && python3 -B test_calc.py", None),  # fails: data
    ("sed -i 's/a - b/a + b/' src/calc.py && python3 -B test_calc.py", "ok\n"),
    ("cd src", None),
    ("ls", "__init__.py\ncalc.py\n"),
    ("cd .. && wc -l < src/calc.py", "2\n"),
    ("unset GREETING; echo ${GREETING-gone}", "gone\n"),
    ("for i in 1 2 3; do echo line $i; done | tail -1", "line 3\n"),
    ("python3 -c 'import sys; print(sys.stdin.read() == \"\")'", "True\n"),
    ("ls nope", None),  # fails: data
    ("echo $?", "0\n"),  # a new shell: the last status does not carry
    ("export PATH=$PWD/bin:$PATH && mkdir -p bin && printf '#!/bin/sh\\necho tool\\n' > "
     "bin/mytool && chmod +x bin/mytool", None),
    ("mytool && basename $PWD", "tool\ndemo\n"),
]


async def test_a_model_style_run_of_20_commands_in_one_session(host: Host,
                                                               tmp_path: Path) -> None:
    made = await host.call("new_session", {"cwd": str(tmp_path)})
    outcomes = []
    for command, expected in MODEL_RUN:
        answer = await host.run(command, session=made["session"])
        assert answer["state"] == "finished", command
        outcomes.append(answer["outcome"])
        if expected is not None:
            out = answer["stdout"]["head"]
            assert out.endswith(expected) if expected.startswith("/") else out == expected, \
                (command, answer)
    assert len(MODEL_RUN) == 20
    assert outcomes.count("failed") == 2 and outcomes.count("succeeded") == 18
    listed = await host.call("list", {"session": made["session"]})
    assert listed["sessions"][0]["cwd"] == str(tmp_path / "demo")
    assert listed["sessions"][0]["commands"] == 20
