"""The batch service: OpenAI's offline Files and Batches API (live embedding request coalescing: batcher).

It serves ``/v1/files`` and ``/v1/batches`` on the platform. Not to be confused with ``runtime.batcher``,
which joins live embedding requests into one engine call while their callers wait.

Clients upload a JSONL file and create a batch for ``/v1/chat/completions``, ``/v1/completions`` or
``/v1/embeddings``; the service runs its lines through the router at low priority, only while the model's
replicas have headroom, and writes OpenAI's output and error files. State lives in SQLite (WAL, one
transaction per step) and files in a directory or S3, so a crash at any point resumes and every input
line appears exactly once, by ``custom_id``, in the output or the error file.

One job per module: ``objects`` (the API's shapes), ``lifecycle`` (the state machine), ``validate`` (an
input file's lines), ``multipart`` (uploads), ``pacing`` (how many requests may be in flight) are pure;
``store`` (SQLite), ``blobs`` (files), ``client`` (the router), ``runner`` (the work), ``api`` (HTTP) and
``__main__`` are the shells around them.
"""
