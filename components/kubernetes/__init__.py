"""The Kubernetes layer every target shares: the platform's objects as thin Pulumi components (engines, gateway,
scaling, observability, batches, the limit store, the cluster's add-ons), the runtime images they run (``images``)
and the stack's secret config (``secrets``). The clouds build on it; it knows no cloud."""
