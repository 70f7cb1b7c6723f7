"""Many submissions from many uids at once: every accepted task ends with exactly one record."""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

from daemon_util import RunningDaemon, User, as_users

from supervisor.client import Client

Start = Callable[..., RunningDaemon]
PER_UID = int(os.environ.get("CORRAL_TEST_SUBMISSIONS_PER_UID", "250"))


def test_a_thousand_submissions_across_four_uids_each_get_one_record(
        start_daemon: Start, users: list[User]) -> None:
    d = start_daemon("--max-running", "16")

    def submit_and_wait() -> Any:
        with Client(d.socket, timeout=120) as c:
            ids = [c.submit(["true"], name=f"n{i}").id for i in range(PER_UID)]
            outcomes = [c.wait(i).outcome for i in ids]
            return [ids, outcomes]

    results = as_users([(u, submit_and_wait) for u in users], timeout=600)
    all_ids = [i for ids, _ in results for i in ids]
    assert len(all_ids) == len(set(all_ids)) == 4 * PER_UID
    for _, outcomes in results:
        assert Counter(outcomes) == {"succeeded": PER_UID}
    rows = d.rows()
    assert len(rows) == 4 * PER_UID
    assert Counter(r["uid"] for r in rows) == {u.uid: PER_UID for u in users}
    for row in rows:
        assert row["state"] == "finished" and row["outcome"] == "succeeded"
        result = json.loads(row["result"])
        assert result["started"] is True and result["cleanup"]["state"] == "clean", result
    by_id = {str(r["seq"]): r for r in rows}
    for user, (ids, _) in zip(users, results, strict=True):
        assert {by_id[i]["uid"] for i in ids} == {user.uid}
