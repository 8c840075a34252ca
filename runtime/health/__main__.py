"""``python -m runtime.health --config FILE``: run the health monitor."""

from __future__ import annotations

from aiohttp import web

from runtime.config import RuntimeConfig
from runtime.discovery import watch_replicas
from runtime.health.app import make_app
from runtime.health.kube import Actions, KubernetesActions, NoActions
from runtime.health.monitor import Monitor
from runtime.service import command_line, exit_bad_config, new_event_loop


def build_actions(config: RuntimeConfig) -> Actions:
    s = config.health
    if not (s.kubernetes_events or s.remediate_after_s is not None):
        return NoActions()
    return KubernetesActions.in_cluster(
        events=s.kubernetes_events, remediation=s.remediate_after_s is not None
    )


def main(argv: list[str] | None = None) -> None:
    args, config = command_line("python -m runtime.health", "health", __doc__, argv)
    try:
        actions = build_actions(config)
    except Exception as err:  # no in-cluster credentials: a deployment mistake, said plainly
        exit_bad_config(
            [f"{args.config}: health.kubernetes_events/remediate_after_s need the Kubernetes API: {err}"]
        )
    monitor = Monitor(config, watch=watch_replicas, actions=actions)
    web.run_app(
        make_app(monitor),
        host=args.host or config.health.host,
        port=args.port or config.health.port,
        access_log=None,
        print=None,
        shutdown_timeout=5,
        loop=new_event_loop(),
    )


if __name__ == "__main__":
    main()
