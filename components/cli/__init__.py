"""The `inferstack` command line: ``main`` (every command; `plan`, `size`, `schema`, `local` ...), ``cost``
(`inferstack cost`, which answers without loading Pulumi) and ``report`` (the plan's report). Empty on purpose:
`inferstack --help` imports only what the command it runs needs."""
