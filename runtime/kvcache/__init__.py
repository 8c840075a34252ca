"""What an engine holds in its prefix cache, as its own KV-cache events say, for any runtime service.

vLLM publishes every block it stores, evicts or clears on a ZeroMQ socket (``--kv-events-config``); a
follower keeps, per model, the set of blocks each replica holds, and a request's prompt is turned into the
same block hashes the engine computes (its tokenizer, chat template, hash function and seed), so "how many
leading blocks of this prompt does replica X hold" is a lookup, not a guess.

    hashing.py   vLLM's block hash: sha256 of canonical CBOR over (parent, token ids, extra keys)
    events.py    msgpack event batches -> typed events (malformed input is a ``BadEventError``, never a crash)
    view.py      the per-model index: block -> holders, parent, children; bounded; pure
    prompts.py   a request's prompt -> token ids, as the engine tokenizes it (tokenizers + jinja2)
    follower.py  one subscription per replica: live events, replay after (re)connect, gaps, restarts
"""
