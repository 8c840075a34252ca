"""The inferstack router: an OpenAI-compatible, cache- and load-aware gateway for engine fleets.

Request path, one module per job::

    server.py      lean HTTP/1.1 server (asyncio protocol + httptools), back-pressure, 413, sweeping
    app.py         validate -> authenticate -> route -> proxy with retries -> relay -> account
    auth.py        API keys (SHA-256 only), model scopes, per-key request/token buckets
    admission.py   per-model FIFO wait line with a deadline (429 + Retry-After beyond it)
    strategies/    filters -> scorers in [0, 1] (affinity or distribution) -> picker; one file each
    upstream.py    keep-alive connections to engines; bytes through, never re-serialised
    backends.py    per-replica state: in-flight, engine queue/KV, TTFT EWMA, circuit breaker
    retry.py       retry budget and backoff
    fleet.py       replicas from discovery, load/health from the health feed or our own probe
    metrics.py     inferstack_router_* in a registry of its own
    __main__.py    ``python -m runtime.router --config FILE``: reload on change, drain on SIGTERM
"""
