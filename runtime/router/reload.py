"""The router's files (config, its plug-ins and strategies, the API keys) read as one checked unit: at
start, and again whenever one of them changes (a ConfigMap or Secret update, an edit under ``make local``).

A change that does not check out, or that the router cannot apply, is logged with its reason and
counted (``inferstack_router_config_reload_failures_total``); the last good config keeps serving and
the watch goes on, so the next good change is picked up. Plug-in modules are imported once: a changed
plug-in file needs a restart, a newly listed one is imported on reload.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from pathlib import Path

from runtime.api_keys import KeyTable, files_digest, keys_path, load_key_table
from runtime.config import REDIS_URL, RuntimeConfig
from runtime.config_file import ConfigError, problem_lines, read_config
from runtime.kvcache.prompts import PromptTokens, TokenizerError
from runtime.router.app import Router
from runtime.scheduling import load_plugins, problems

log = logging.getLogger("inferstack.router")


def _strategy_lines(path: Path, cfg: RuntimeConfig) -> list[str]:
    """Unknown scorer names in any strategy of the file (plug-ins loaded), with where they are."""
    placed = [("router.default_strategy", cfg.router.default_strategy)] + [
        (f"router.routes[{i}].strategy", route.strategy) for i, route in enumerate(cfg.router.routes)
    ]
    return [
        line
        for where, strategy in placed
        for line in problem_lines(path, problems(strategy.name, strategy.weights), where)
    ]


def _file_lines(path: Path, cfg: RuntimeConfig) -> list[str]:
    """Files the config names that the router must read: the store's token, the models' tokenizers."""
    lines: list[str] = []
    store = cfg.router.limit_store
    if store is not None:
        for name, file in (("auth_token_file", store.auth_token_file), ("url_file", store.url_file)):
            if file is not None and not file.is_file():
                lines.append(
                    f"{path}: router.limit_store.{name}: {file} is not a readable file"
                    " (mount the store's Secret there, or remove the field)"
                )
        if store.url_file is not None and store.url_file.is_file():
            url = store.url_file.read_text().strip()
            if not re.match(REDIS_URL, url):
                lines.append(
                    f"{path}: router.limit_store.url_file: {store.url_file} holds {url[:60]!r}, not"
                    " redis://host:port or rediss://host:port"
                )
    for i, target in enumerate(cfg.models):
        if target.kv_events is not None:
            try:
                PromptTokens.load(target.kv_events.tokenizer_dir)
            except TokenizerError as err:
                lines.append(f"{path}: models[{i}].kv_events.tokenizer_dir: {err}")
    return lines


def read_router_config(path: Path) -> RuntimeConfig:
    """The config with its plug-ins imported and its strategies' names checked; ``ConfigError``, one
    line per mistake, naming file and field."""
    cfg = read_config(path)
    lines = problem_lines(path, load_plugins(cfg.router.plugins), "router")
    lines += _strategy_lines(path, cfg)
    lines += _file_lines(path, cfg)
    if lines:
        raise ConfigError(lines)
    return cfg


def load_router_files(path: Path, previous: KeyTable | None = None) -> tuple[RuntimeConfig, KeyTable]:
    """The checked config and the merged key table (inline keys plus the keys file)."""
    cfg = read_router_config(path)
    keys_file = keys_path(cfg.router.api_keys_file, path)
    return cfg, load_key_table(cfg.router.api_keys, keys_file, time.monotonic(), previous)


def reload(router: Router, path: Path) -> None:
    """Read the files again and install them; raises (and changes nothing) when they do not check out."""
    cfg, keys = load_router_files(path, router.keys)
    if (cfg.router.host, cfg.router.port) != (router.cfg.router.host, router.cfg.router.port):
        log.warning("listener address changes need a restart; other changes applied")
    router.reconfigure(cfg, keys)
    log.info("config reloaded", extra={"models": [m.name for m in cfg.models]})


async def watch(router: Router, path: Path) -> None:
    """Reload whenever the config or keys file changes; never ends on a bad change."""
    seen = files_digest(path, keys_path(router.cfg.router.api_keys_file, path))
    while True:
        await asyncio.sleep(router.cfg.router.config_reload_interval_ms / 1000)
        now = files_digest(path, keys_path(router.cfg.router.api_keys_file, path))
        if now == seen:
            continue
        seen = now
        try:
            reload(router, path)
        except ConfigError as err:
            router.metrics.config_reload_failures.inc()
            log.error("config change refused; the running config stays", extra={"problems": err.lines})
        except Exception:  # not a mistake in the file but a failure to apply it: keep serving and watching
            router.metrics.config_reload_failures.inc()
            log.exception("config change could not be applied; the running config stays")
