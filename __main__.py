"""Entry point of `pulumi up`: everything lives in components.deploy.program."""

from components.deploy.program import run

run()
