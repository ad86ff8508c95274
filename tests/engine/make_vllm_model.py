"""A tiny random-weight Llama in Hugging Face's layout, for vLLM in the real-engine tests.

Run by the vLLM venv's python (``tests/engine/install-vllm.sh``): it needs ``tokenizers``,
``safetensors`` and ``numpy``, which vLLM brings. Nothing is downloaded: the tokenizer is
trained here on a generated corpus, the weights are random. The text the model writes is
nonsense; what matters is that real vLLM tokenizes, schedules, runs prefill and decode,
caches prefixes, streams and counts as it does for a real model.

- ``LlamaForCausalLM``: 2 layers, hidden 128, 4 heads of 32 (4 KV heads), MLP 256, float32.
  vLLM's CPU attention rejects a head size of 16, and bfloat16 crashed on this machine's
  CPU build, hence 32 and float32. About 1.3 MB of weights.
- Tokenizer: byte-level BPE (1,024 tokens, ``<unk>`` 0, ``<s>`` 1, ``</s>`` 2) trained on
  words drawn from a fixed syllable list; ``tokenizer_config.json`` holds a small chat
  template (``<|role|>`` lines), so ``/v1/chat/completions`` works.
- Weights: normal from ``numpy.random.default_rng(seed)``, scaled as in
  ``tests/engine/make_model.py``; the output rows of the three special tokens are zero, so
  greedy decoding never picks ``</s>`` and a stream runs to ``max_tokens``; nor do those
  of tokens that are not printable ASCII alone (byte-level BPE's lone non-ASCII bytes,
  which vLLM streams as an empty delta), so every streamed token carries text.

The directory is cached outside the repository, beside the venv:
``$LLM_HEALTH_VLLM/../models/tiny-llama-hf-g<GENERATOR_VERSION>-seed<seed>``. Bump
``GENERATOR_VERSION`` whenever the output changes.

Command line (``make test-engine`` runs it)::

    "$VENV/bin/python" tests/engine/make_vllm_model.py --out DIR --seed 1
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path
from typing import Any

GENERATOR_VERSION = 2
N_LAYER = 2
HIDDEN = 128
N_HEAD = 4
N_HEAD_KV = 4
MLP = 256
VOCAB = 1024
MAX_POSITIONS = 2048
RMS_EPS = 1e-5
LOGIT_STD = 2.5
SPECIAL = ["<unk>", "<s>", "</s>"]
SYLLABLES = (  # noqa: SIM905 - a word list reads better as text
    "ba be bi bo bu ka ke ki ko ku la le li lo lu ma me mi mo mu na ne ni no nu "
    "ra re ri ro ru sa se si so su ta te ti to tu va ve vi vo vu hi ho he the and "
    "of to in is it you that was for on are with as his they at be this have from"
).split()
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "<|{{ message['role'] }}|>\n{{ message['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def model_dir(out: Path, seed: int) -> Path:
    return out / f"tiny-llama-hf-g{GENERATOR_VERSION}-seed{seed}"


def ensure_model(out: Path, seed: int) -> Path:
    """The cached model directory for ``seed``, written first if it is not there yet."""
    path = model_dir(out, seed)
    if not (path / "config.json").exists():
        partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        write_tokenizer(partial, seed)
        write_weights(partial, seed, never_argmax(partial))
        write_config(partial)
        shutil.rmtree(path, ignore_errors=True)
        partial.rename(path)
    return path


def corpus(seed: int, lines: int = 4000) -> list[str]:
    """Lines of words made of 1-3 syllables: enough text for 1,024 BPE merges."""
    import numpy as np

    rng = np.random.default_rng(1000 + seed)
    made = []
    for _ in range(lines):
        words = []
        for _ in range(int(rng.integers(4, 16))):
            count = int(rng.integers(1, 4))
            words.append("".join(SYLLABLES[int(i)] for i in rng.integers(0, len(SYLLABLES), count)))
        made.append(" ".join(words) + ".")
    return made


def write_tokenizer(path: Path, seed: int) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=SPECIAL,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus(seed), trainer=trainer)
    tokenizer.save(str(path / "tokenizer.json"))
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "add_bos_token": False,
        "model_max_length": MAX_POSITIONS,
        "chat_template": CHAT_TEMPLATE,
    }
    (path / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    special = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    (path / "special_tokens_map.json").write_text(json.dumps(special, indent=2))


def never_argmax(path: Path) -> list[int]:
    """The ids greedy decoding must never pick: the special tokens, and every token that
    is not printable ASCII on its own (a lone byte of a UTF-8 sequence streams as an empty
    delta: no text until the next token)."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
    size = tokenizer.get_vocab_size()
    printable = [tokenizer.decode([i]) for i in range(size)]
    return [
        i
        for i, text in enumerate(printable)
        if i < len(SPECIAL) or not text or not all(" " <= c <= "~" for c in text)
    ]


def write_weights(path: Path, seed: int, silenced: list[int]) -> None:
    import numpy as np
    from safetensors.numpy import save_file

    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], std: float) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    head = HIDDEN // N_HEAD
    tensors: dict[str, Any] = {"model.embed_tokens.weight": normal((VOCAB, HIDDEN), 1.0)}
    for layer in range(N_LAYER):
        block = {  # (outputs, inputs), as torch's Linear keeps them
            "input_layernorm": np.ones(HIDDEN, np.float32),
            "self_attn.q_proj": normal((N_HEAD * head, HIDDEN), HIDDEN**-0.5),
            "self_attn.k_proj": normal((N_HEAD_KV * head, HIDDEN), HIDDEN**-0.5),
            "self_attn.v_proj": normal((N_HEAD_KV * head, HIDDEN), HIDDEN**-0.5),
            "self_attn.o_proj": normal((HIDDEN, N_HEAD * head), 0.5 * HIDDEN**-0.5),
            "post_attention_layernorm": np.ones(HIDDEN, np.float32),
            "mlp.gate_proj": normal((MLP, HIDDEN), HIDDEN**-0.5),
            "mlp.up_proj": normal((MLP, HIDDEN), HIDDEN**-0.5),
            "mlp.down_proj": normal((HIDDEN, MLP), 0.5 * MLP**-0.5),
        }
        tensors.update({f"model.layers.{layer}.{k}.weight": v for k, v in block.items()})
    output = normal((VOCAB, HIDDEN), LOGIT_STD * HIDDEN**-0.5)
    output[silenced] = 0.0  # logits at the mean: never the argmax (no early </s>, no lone byte)
    tensors["model.norm.weight"] = np.ones(HIDDEN, np.float32)
    tensors["lm_head.weight"] = output
    save_file(tensors, str(path / "model.safetensors"), metadata={"format": "pt"})


def write_config(path: Path) -> None:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": HIDDEN,
        "intermediate_size": MLP,
        "num_hidden_layers": N_LAYER,
        "num_attention_heads": N_HEAD,
        "num_key_value_heads": N_HEAD_KV,
        "head_dim": HIDDEN // N_HEAD,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_POSITIONS,
        "rms_norm_eps": RMS_EPS,
        "rope_theta": 10000.0,
        "vocab_size": VOCAB,
        "bos_token_id": 1,
        "eos_token_id": 2,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(config, indent=2))
    generation = {"bos_token_id": 1, "eos_token_id": 2}
    (path / "generation_config.json").write_text(json.dumps(generation, indent=2))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="the models' cache directory")
    parser.add_argument("--seed", type=int, action="append", required=True)
    args = parser.parse_args(argv)
    for seed in args.seed:
        print(ensure_model(args.out.resolve(), seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
