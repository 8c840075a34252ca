"""``python -m components.local up|down|status|logs``: the same as ``inferstack local ...``.

The detached supervisor runs this way (``inferstack local up --detach`` starts it in its own session).
"""

from components.local.cli import local_app

local_app(prog_name="inferstack local")
