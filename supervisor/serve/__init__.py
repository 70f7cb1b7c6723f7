"""``corral serve``: the daemon, HTTP/1.1 + JSON over a Unix socket (h11 on trio).

Kept import-light: importing ``supervisor.serve`` (or its ``protocol`` module, which the clients
share) loads neither trio nor the core.  The daemon itself starts at
:func:`supervisor.serve.daemon.serve`.

Modules (imports point down this list's dependencies only: no cycles)::

    protocol.py     request and response types, shared by the server and every client (no trio)
    daemon.py       the main loop: its steps, the drain, the hand-over on `systemctl restart`
    server.py       the listening sockets and the connections on them
    http.py         one h11 connection: limits, timeouts, JSON and NDJSON responses
    routes.py       (method, path) -> the verb's handler
    verbs/          one module per verb: submit, list, show, wait, output, stop, stdin,
                    events, limits, metrics
    state.py        Config, and Daemon: what the verbs work on (task table, queue, records)
    daemontask.py   a task as the daemon holds it, and a recorded row's JSON
    dispatch.py     from the queue to the core and back: "starting" record, start, end
                    record (retried)
    recover.py      start-up: an earlier run's tasks run, go on (adopted) or are recorded lost
    retention.py    finished tasks expire by age, count and bytes
    hooks.py        completion callbacks (--on-finish-exec, --on-finish-url)
    specs.py        a submission's TaskSpec, as its submitter
    scheduler.py    the queue: global and per-uid limits, round-robin between uids
    records.py      SQLite task records (WAL, synchronous=FULL, group commit), off the trio
                    thread; rows.py: their SQL; schema.py: the schema and its migrations
    peers.py        who is calling (SO_PEERCRED, SO_PEERGROUPS) and as whom tasks run
    events.py       state changes for /v1/events subscribers
    metrics.py      Prometheus metrics (prometheus_client)
    sdnotify.py     systemd's notify protocol, fd store and socket activation, no library
    sdjob.py        is systemd restarting us? (D-Bus, on SIGTERM)
    fdstore.py      running tasks parked in the fd store across a restart, and taken back

docs/durability.md says what is on disk when, and what a restart or a crash does.
"""
