"""Defaults the control plane and the runtime share, in a module without pydantic: the command line shows
them as option defaults before it has loaded anything else (``runtime.config`` builds every model)."""

from __future__ import annotations

#: Sequences an engine decodes together unless the spec says otherwise (EngineSpec.max_num_seqs); it is
#: also what a replica may hold in flight, and what a command line without the flag is read as.
DEFAULT_MAX_NUM_SEQS = 256
