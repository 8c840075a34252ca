"""One model's KV-event view in the router: what its replicas cache, and a request's prompt as their blocks.

Built only for a model whose config follows KV events (``ModelTarget.kv_events``) and whose strategy reads
``Need.PROMPT_BLOCKS`` (the ``precise_prefix`` scorer). The followers (``runtime.kvcache.follower``) keep
the index current; :meth:`ModelCacheView.prompt_blocks` turns a request body into the engines' block
hashes. Problems on a stream are counted per cause and logged once per (replica, cause).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

from runtime.config import KvEventsSource, ModelTarget
from runtime.kvcache.follower import Endpoints, Followers
from runtime.kvcache.hashing import BlockHasher
from runtime.kvcache.prompts import PromptTokens
from runtime.kvcache.view import CacheIndex

log = logging.getLogger("inferstack.router.kvcache")

#: (model, cause) -> None: the router's metrics count problems per cause.
ProblemCounter = Callable[[str, str], None]


def event_endpoints(target: ModelTarget, source: KvEventsSource) -> Callable[[str], Endpoints]:
    """Where each replica of ``target`` publishes: as configured for a static replica, else its host at the
    source's ports (what the control plane renders into every engine's --kv-events-config)."""
    static = {str(b.url).rstrip("/"): b for b in target.static_backends}

    def where(url: str) -> Endpoints:
        host = urlsplit(url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        b = static.get(url)
        return Endpoints(
            events=(b.kv_events_endpoint if b else None) or f"tcp://{host}:{source.port}",
            replay=(b.kv_replay_endpoint if b else None) or f"tcp://{host}:{source.replay_port}",
        )

    return where


class ModelCacheView:
    def __init__(self, target: ModelTarget, source: KvEventsSource) -> None:
        self.model = target.name
        self.source = source
        self.index = CacheIndex(source.max_blocks)
        self.tokens = PromptTokens.load(source.tokenizer_dir)
        self.hasher = BlockHasher(source.hash_seed)
        self.count_problem: ProblemCounter = lambda model, cause: None
        self._logged: set[tuple[str, str]] = set()
        self.followers = Followers(
            self.index,
            source.topic,
            source.replay_timeout_ms / 1000,
            event_endpoints(target, source),
            self._problem,
        )

    def _problem(self, url: str, cause: str) -> None:
        self.count_problem(self.model, cause)
        if (url, cause) not in self._logged:
            self._logged.add((url, cause))
            log.warning("KV events of %s (%s): %s (logged once per cause)", url, self.model, cause)

    def prompt_blocks(self, kind: str, payload: dict[str, Any], max_blocks: int) -> list[int]:
        """The engines' hashes of the prompt's full blocks; empty when they cannot be computed exactly."""
        size = self.index.block_size
        if size is None:  # no event yet: the engines' block size is not known
            return []
        tokens = self.tokens.tokens(kind, payload)
        if not tokens:
            return []
        salt = payload.get("cache_salt")
        return self.hasher.hashes(tokens, size, max_blocks, salt if isinstance(salt, str) else None)
