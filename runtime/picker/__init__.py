"""The inferstack endpoint picker: the router's scheduler behind any gateway that speaks the Gateway API
Inference Extension's Endpoint Picker Protocol (Envoy ext_proc v3 over gRPC).

The gateway (Envoy Gateway, Istio, kgateway, GKE's, or the Envoy ``make local GATEWAY=envoy`` renders)
streams each request's headers and body here; the picker reads the model and the prompt the way the
router does, asks the same ``runtime.scheduling`` strategy for a replica, and answers with the
``x-gateway-destination-endpoint`` header and ``envoy.lb`` metadata (the pick, then fallbacks), or an
OpenAI-shaped immediate answer (404 unknown model, 503 full or none ready, 400/413 bad body).

    protocol.py   the Endpoint Picker Protocol on the generated ext_proc messages (PyPI xds-protos)
    exchange.py   one ext_proc stream = one request: headers -> body -> pick -> outcome
    decide.py     pure: request in, pick (with fallbacks) or the gateway's own answer out
    replicas.py   per-replica and per-model state the scheduler reads (the scheduler's Replica protocol)
    fleet.py      replicas from discovery, load and health from the health feed or a probe (runtime.signal_loop)
    metrics.py    inferstack_picker_*: the router's scheduling gauges, picks, refusals, outcomes
    service.py    the gRPC server (ext_proc, health) and the HTTP side (/metrics, /healthz, /readyz)
    __main__.py   ``python -m runtime.picker --config FILE``
"""
