"""``supervisor.client.AsyncClient``: the same verbs for trio programs."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio
from daemon_util import RunningDaemon

from supervisor.client import ApiError, AsyncClient

Start = Callable[..., RunningDaemon]


async def test_async_client_verbs(start_daemon: Start) -> None:
    d = await trio.to_thread.run_sync(start_daemon)
    async with AsyncClient(d.socket) as c:
        task = await c.submit(["sh", "-c", "echo one; sleep 0.1; echo two; exit 5"])
        data = b""
        end = None
        async for frame in c.output(task.id, follow=True):
            if frame.kind == "data":
                assert frame.offset == len(data)
                data += frame.data
            elif frame.kind == "end":
                end = frame
        assert data == b"one\ntwo\n" and end is not None and end.exit_status == 5
        info = await c.wait(task.id)
        assert info.outcome == "failed" and info.exit_status == 5
        assert [t.id for t in await c.list()] == [task.id]
        assert (await c.show(task.id)).result == info.result
        assert (await c.limits())["uid"] == 0
        long = await c.submit(["sleep", "30"])
        assert await c.stop(long.id, force=True) is True
        assert (await c.wait(long.id)).outcome == "cancelled"
        with pytest.raises(ApiError) as caught:
            await c.show("12345")
        assert caught.value.status == 404


async def test_async_client_survives_an_abandoned_stream(start_daemon: Start) -> None:
    d = await trio.to_thread.run_sync(start_daemon)
    async with AsyncClient(d.socket) as c:
        task = await c.submit(["sh", "-c", "while :; do echo x; sleep 0.01; done"])
        with trio.move_on_after(0.3):
            async for _ in c.output(task.id, follow=True):
                pass
        # the connection was dropped mid-stream; the next call opens a new one
        assert await c.stop(task.id, force=True) is True
        async for event in c.events():
            assert event == {"subscribed": True}
            break
        assert (await c.wait(task.id)).outcome == "cancelled"


async def test_async_client_sessions_signals_and_terminals(start_daemon: Start) -> None:
    d = await trio.to_thread.run_sync(start_daemon)
    async with AsyncClient(d.socket) as c:
        s = await c.open_session(cwd="/")
        first = await c.exec(s["id"], "cd /usr && export X=1", wait="10s")
        assert first["carried"] == {"cwd": "/usr", "set": ["X"], "unset": []}
        second = await c.exec(s["id"], "echo $X $PWD", wait="10s", stdin=b"unused")
        assert second["result"]["output"]["stdout"]["head"] == "1 /usr\n"
        running = await c.exec(s["id"], "trap 'echo got INT; exit 4' INT; echo up; "
                                        "while :; do sleep 0.05; done", wait="0.5s")
        assert running["state"] == "running"
        assert (await c.signal(running["id"], "INT"))["signal"] == "SIGINT"
        assert (await c.wait(running["id"])).exit_status == 4
        tty = await c.submit(["sh", "-c", "read x; stty size"], tty={"rows": 5, "cols": 7})
        while (await c.show(tty.id)).state != "running":
            await trio.sleep(0.02)
        await c.resize(tty.id, 9, 33)
        await c.write_stdin(tty.id, b"\n")
        done = await c.wait(tty.id)
        assert "9 33" in done.result["output"]["stdout"]["head"]
        closed = await c.close_session(s["id"])
        assert closed["state"] == "closed" and (await c.show_session(s["id"]))["env"] is None


def test_both_clients_have_every_verb_with_the_same_parameters() -> None:
    import inspect

    from supervisor.client import AsyncSession, Client, Session

    for sync, asynchronous in ((Client, AsyncClient), (Session, AsyncSession)):
        verbs = {n for n in vars(sync) if not n.startswith("_") and callable(getattr(sync, n))}
        for name in verbs - {"close"}:
            assert hasattr(asynchronous, name), f"{asynchronous.__name__}.{name} is missing"
            assert list(inspect.signature(getattr(sync, name)).parameters) == list(
                inspect.signature(getattr(asynchronous, name)).parameters), name


async def test_async_sessions_waits_and_metrics(start_daemon: Start) -> None:
    d = await trio.to_thread.run_sync(start_daemon)
    async with AsyncClient(d.socket) as c:
        async with await c.session(cwd="/") as s:
            assert (await s.run("cd /tmp && export X=1"))["state"] == "finished"
            ran = await s.run("echo $X; pwd")
            assert ran["result"]["output"]["stdout"]["head"] == "1\n/tmp\n"
            long = await s.start("sleep 30", background=True)
            assert [x["id"] for x in await c.sessions()] == [s.id]
        assert (await c.wait(long["id"])).outcome == "cancelled"  # closed with its session
        task = await c.submit(["sh", "-c", "printf abcdef; sleep 30"])
        still = await c.wait(task.id, timeout=0.5)
        assert still.state == "running"
        frames = [f async for f in c.output(task.id, tail=3)]
        assert [f.data for f in frames if f.kind == "data"] == [b"def"]
        assert "corral_tasks" in await c.metrics()
        assert await c.stop(task.id, force=True)
