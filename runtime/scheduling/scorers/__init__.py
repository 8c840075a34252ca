"""Built-in scorers, one module each; ``runtime.scheduling.registry`` finds every module here."""
