"""The base every layer of components reads, importing nothing of components: the spec's enumerations (``enums``),
the hardware catalog (``catalog``), the arithmetic over it (``sizing``: will a model fit a GPU; ``packing``: engines
on shared GPUs) and a stack file's problems (``problems``)."""
