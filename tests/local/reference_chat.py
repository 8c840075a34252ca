"""Greedy chat answers from the reference implementation (``transformers``), for comparison with vLLM.

Runs under the ENGINE venv's python (it has torch and transformers):

    .venv-engine/bin/python tests/local/reference_chat.py MODEL_DIR DTYPE MAX_NEW_TOKENS PROMPT [PROMPT ...]

Prints a JSON list of answers, one per prompt: the model's chat template applied to one user message,
greedy decoding, special tokens dropped, in DTYPE (torch's name: the dtype the local stack serves in, so
the two implementations multiply the same numbers).
"""

from __future__ import annotations

import json
import os
import sys


def main(argv: list[str]) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model_dir, dtype, max_new_tokens, prompts = argv[0], getattr(torch, argv[1]), int(argv[2]), argv[3:]
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=dtype).eval()
    answers = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        answers.append(tokenizer.decode(out[0][ids.shape[1] :], skip_special_tokens=True))
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
