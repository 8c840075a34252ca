"""Model weights on the control plane, as pure decisions: where a model's weights live in the platform's store
(``store``), how each engine gets them from there (``fetch``: the streamer or a node-level cache, with the
reason) and how long a cold start takes on each path (``coldstart``). No Pulumi, no render module: placement,
the plan report and the renderers all read the same answers. The data plane that acts on them is
``runtime/weights``.
"""
