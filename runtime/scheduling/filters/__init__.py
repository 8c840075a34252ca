"""Built-in filters, one module each; ``runtime.scheduling.registry`` finds every module here."""
