"""The batcher: live embedding requests joined into one engine call (offline OpenAI batches: batch_service).

It coalesces concurrent ``/v1/embeddings`` requests for pooling engines into one engine call per batch,
waiting at most ``max_wait_ms`` for company; each caller gets its own answer. Not to be confused with
``runtime.batch_service``, OpenAI's Files and Batches API, which runs uploaded files of requests later.

``python -m runtime.batcher --config FILE``. Pieces: ``core`` (pure: input shapes, batch assembly,
result splitting, usage apportioning), ``service`` (queues, dispatcher, per-member retry, replicas),
``metrics`` (``inferstack_batcher_*``), ``app`` (HTTP, backpressure, client disconnects).
"""
