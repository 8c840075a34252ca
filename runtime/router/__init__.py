"""The inferstack router: an OpenAI-compatible, cache- and load-aware gateway for engine fleets.

Request path, one module per job::

    server.py      lean HTTP/1.1 server (asyncio protocol + httptools), back-pressure, 413, sweeping
    app.py         dispatch; authenticate -> read -> admit -> route with retries
    (runtime.api_keys: API keys, SHA-256 only, model scopes, per-key buckets: shared with the picker)
    payload.py     what a body says: model, stream, the prompt a prefix cache sees, usage in answers
    admission.py   a replica with room, or a per-model FIFO wait with a deadline (503 + Retry-After)
    proxy.py       one try on one replica: bytes through, first chunk before headers, accounting
    upstream.py    keep-alive connections to engines; bytes through, never re-serialised
    replicas.py    per-replica state: in-flight, engine queue/KV, TTFT EWMA, circuit breaker
    retry.py       retry budget and backoff
    fleet.py       replicas from discovery, load/health from the health feed or our own probe
                   (runtime.signal_loop, shared with the picker; the router's step: signals.py, sleep.py)
    metrics.py     inferstack_router_* in a registry of its own, live gauges at scrape time
    reload.py      config + plug-ins + strategies + API keys read as one checked unit, re-read on change
    __main__.py    ``python -m runtime.router --config FILE``: drain on SIGTERM

Which replica is ``runtime.scheduling``'s decision (filters -> scorers -> picker), a library the router
shares with any other front end.
"""
