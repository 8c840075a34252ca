"""The batcher: coalesces concurrent embedding requests into one engine call per batch.

``python -m runtime.batcher --config FILE``. Pieces: ``core`` (pure: input shapes, batch assembly,
result splitting, usage apportioning), ``service`` (queues, dispatcher, per-member retry, replicas),
``metrics`` (``inferstack_batcher_*``), ``app`` (HTTP, backpressure, client disconnects).
"""
