"""Model weights in the platform's store: prepared once, verified, cached on nodes, streamed into engines.

The data-plane half of the model store (the control plane renders the Job and the init containers that run
it: ``components/render/weights.py``). One S3 prefix per model and revision holds the model's files and,
written last, ``inferstack-weights.json``: the manifest that names every file with its size and SHA-256.
The manifest is the commit point: a prefix without one is not prepared, and nothing reads it.

- ``manifest``: what identifies weights by content (file sizes and hashes, the safetensors index).
- ``store``: the S3 side: read and write a prefix, check its objects against the manifest.
- ``prepare``: hub or directory -> the store; idempotent, resumable, verified.
- ``node_cache``: the store -> a node's local disk, once per node and revision, under a lock.
- ``__main__``: ``python -m runtime.weights prepare|fetch|verify``, what the Job and init containers run.

No Pulumi, no ``components``: the weights image carries only ``runtime/weights``, ``runtime/revision.py`` (what
pins a hub revision, shared with the spec) and its pinned libraries.
"""
