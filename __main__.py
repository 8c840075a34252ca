"""Entry point of `pulumi up`: everything lives in components.program."""

from components.program import run

run()
