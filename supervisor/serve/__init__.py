"""``corral serve``: the daemon, HTTP/1.1 + JSON over a Unix socket (h11 on trio).

Kept import-light: importing ``supervisor.serve`` (or its ``protocol`` module, which the clients
share) loads neither trio nor the core.  The daemon itself starts at
:func:`supervisor.serve.daemon.serve`.

Modules::

    protocol.py     request and response types, shared by the server and every client (no trio)
    daemon.py       the main loop: state, supervisor, socket, READY=1, serve, drain
    http.py         one h11 connection: limits, timeouts, JSON and NDJSON responses
    routes.py       (method, path) -> the verb's handler
    verbs/          one module per verb: submit, list, show, wait, output, stop, stdin,
                    events, limits, metrics
    tasks.py        a task as the daemon holds it, and its life (queue, start, end, records)
    queue.py        the scheduler: global and per-uid limits, round-robin between uids
    records.py      SQLite task records (WAL, one row per task), off the trio thread
    peers.py        who is calling (SO_PEERCRED, SO_PEERGROUPS) and as whom tasks run
    events.py       state changes for /v1/events subscribers
    metrics.py      Prometheus metrics (prometheus_client)
    sdnotify.py     systemd's notify protocol and socket activation (LISTEN_FDS), no library
"""
