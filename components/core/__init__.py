"""The pure core: every decision a stack makes, as plain functions of the spec (sizing, packing, placement,
startup budgets, rollouts, scaling thresholds, capacity, cost, model weights, version lifecycles), ``decisions``
(which makes a stack's once per plan into one value that everything after reads) and the cloud seam's protocol
(``cloud``). No Pulumi SDK, no cloud and no renderer: `inferstack plan`, `cost` and `size`, the renderers and
the policy pack all call it, and the ``pure-core`` import contract keeps it so for every module added here."""
