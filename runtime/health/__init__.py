"""The health monitor: probes every engine replica, ejects and readmits them, and publishes the feed.

``python -m runtime.health --config FILE``. Pieces: ``probe`` (one bounded HTTP round per replica),
``state`` (eject after K hard failures, readmit after M successes), ``window`` (percentiles from
histogram deltas), ``tracker`` (per-replica signals, stale vs zero), ``monitor`` (discovery and
loops), ``feed`` (the ``GET /v1/backends`` models the router imports), ``exposition``
(``inferstack_health_*`` metrics), ``kube`` (Events and optional remediation), ``app`` (HTTP).
"""
