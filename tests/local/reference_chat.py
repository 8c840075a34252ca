"""Greedy chat answers from the reference implementation (``transformers``), for comparison with vLLM.

Runs under the ENGINE venv's python (it has torch and transformers):

    .venv-engine/bin/python tests/local/reference_chat.py MODEL_DIR DTYPE MAX_NEW_TOKENS PROMPT [PROMPT ...]

Prints a JSON list, one entry per prompt: the model's chat template applied to one user message, greedy
decoding in DTYPE (torch's name: the dtype the local stack serves in, so the two implementations multiply the
same numbers). Each entry has the answer's ``text`` (special tokens dropped), its token ids (``tokens``, end
tokens dropped; ``ends`` lists those) and, per step, how far the chosen token's log-probability was above the runner-up's
(``margins``, nats): where two implementations may part ways, a near tie, and where they may not.
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
    eos = model.generation_config.eos_token_id  # one id or a list of them
    ends = {tokenizer.eos_token_id, *(eos if isinstance(eos, list) else [eos])} - {None}
    answers = []
    for prompt in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}],
            add_generation_prompt=True,
            return_tensors="pt",
            return_dict=True,
        )["input_ids"]
        with torch.no_grad():
            out = model.generate(
                ids,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                output_logits=True,
                return_dict_in_generate=True,
            )
        new = out.sequences[0][ids.shape[1] :].tolist()
        margins = []
        for logits in out.logits:
            top = torch.log_softmax(logits[0].float(), dim=-1).topk(2).values.tolist()
            margins.append(top[0] - top[1])
        kept = [t for t in new if t not in ends]
        answers.append(
            {
                "text": tokenizer.decode(new, skip_special_tokens=True),
                "tokens": kept,
                "margins": margins,  # one per step, the one that chose an end token included
                "ends": sorted(ends),
            }
        )
    print(json.dumps(answers))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
