"""A tiny random-weight llama model (GGUF) for the real-engine tests: llama.cpp's
``llama-server`` loads it in well under a second and answers on one CPU thread in
milliseconds. The text it writes is nonsense; what matters is that a real engine tokenizes,
runs prefill and decode, streams, counts and caches like it does for a real model.

- Architecture ``llama``: 2 blocks, embedding width 64, 4 heads of 16 (4 KV heads), feed
  forward 192, RoPE over the full head. All tensors f32, ~17 MB (the 32000 x 64 embedding
  and output matrices are nearly all of it).
- Vocabulary and tokenizer metadata (SentencePiece, 32000 tokens, BOS 1, EOS 2) are copied
  from ``models/ggml-vocab-llama-spm.gguf`` of the vendored llama.cpp; no chat template is
  set, so llama-server falls back to its built-in ChatML template.
- Weights: normal, from ``numpy.random.default_rng(seed)``, scaled so that a block's
  activations stay O(1) and the final logits have a spread of about 2.5 (top-5 logprobs
  distinct, finite, none near 0). The output rows of every non-normal token (unknown,
  control: BOS/EOS, the 256 byte tokens) are zero: those logits sit at the mean and are
  never the argmax, so greedy decoding never stops early on EOS and never streams a
  half UTF-8 character. Same seed, same bytes; two seeds answer differently.

Models are cached outside the repository next to the engine build:
``$LLM_HEALTH_ENGINE/models/tiny-llama-g<GENERATOR_VERSION>-seed<seed>.gguf``.
Bump ``GENERATOR_VERSION`` whenever the output of :func:`write_model` changes.

Command line (``make test-engine`` runs it)::

    python tests/engine/make_model.py --engine "$LLM_HEALTH_ENGINE" --seed 1 --seed 2
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np  # a dev dependency through matplotlib

GENERATOR_VERSION = 1
N_LAYER = 2
N_EMBD = 64
N_HEAD = 4
N_HEAD_KV = 4
N_FF = 192
N_CTX_TRAIN = 2048
RMS_EPS = 1e-5
LOGIT_STD = 2.5  # spread of the final logits (unit-RMS hidden state x output rows)

LLAMA_CPP = Path("src/vendor/llama.cpp")  # inside the engine cache directory
VOCAB = LLAMA_CPP / "models/ggml-vocab-llama-spm.gguf"
GGUF_PY = LLAMA_CPP / "gguf-py"
COPIED_PREFIX = "tokenizer."  # every tokenizer.ggml.* key of the vocabulary file


def model_path(engine: Path, seed: int) -> Path:
    return engine / "models" / f"tiny-llama-g{GENERATOR_VERSION}-seed{seed}.gguf"


def ensure_model(engine: Path, seed: int) -> Path:
    """The cached model for ``seed``, written first if it is not there yet."""
    path = model_path(engine, seed)
    if not path.exists():
        write_model(engine, seed, path)
    return path


def _gguf(engine: Path) -> Any:
    """The vendored gguf-py package (the version that matches this llama.cpp)."""
    where = str(engine / GGUF_PY)
    if where not in sys.path:
        sys.path.insert(0, where)
    import gguf  # type: ignore[import-not-found]  # importable once the engine cache is known

    return gguf


@functools.cache
def _vocabulary(engine: Path) -> tuple[Any, Any]:
    """gguf-py and the parsed vocabulary file (5 s to parse: once for all seeds)."""
    gguf = _gguf(engine)
    return gguf, gguf.GGUFReader(engine / VOCAB)


def write_model(engine: Path, seed: int, path: Path) -> None:
    """Write the model for ``seed`` to ``path`` (atomically: a temporary file, renamed)."""
    gguf, vocab = _vocabulary(engine)
    token_types = np.asarray(vocab.fields["tokenizer.ggml.token_type"].contents(), np.int32)
    n_vocab = len(token_types)
    rng = np.random.default_rng(seed)

    def normal(shape: tuple[int, ...], std: float) -> Any:
        return (rng.standard_normal(shape) * std).astype(np.float32)

    head_dim = N_EMBD // N_HEAD
    tensors: list[tuple[str, Any]] = [("token_embd.weight", normal((n_vocab, N_EMBD), 1.0))]
    for layer in range(N_LAYER):
        # numpy shape (rows, cols) = (outputs, inputs); gguf-py stores it as ggml ne[] reversed.
        # Input std 1/sqrt(fan_in) keeps each projection's output at unit scale.
        block = {
            "attn_norm": np.ones(N_EMBD, np.float32),
            "attn_q": normal((N_HEAD * head_dim, N_EMBD), N_EMBD**-0.5),
            "attn_k": normal((N_HEAD_KV * head_dim, N_EMBD), N_EMBD**-0.5),
            "attn_v": normal((N_HEAD_KV * head_dim, N_EMBD), N_EMBD**-0.5),
            "attn_output": normal((N_EMBD, N_HEAD * head_dim), 0.5 * N_EMBD**-0.5),
            "ffn_norm": np.ones(N_EMBD, np.float32),
            "ffn_gate": normal((N_FF, N_EMBD), N_EMBD**-0.5),
            "ffn_up": normal((N_FF, N_EMBD), N_EMBD**-0.5),
            "ffn_down": normal((N_EMBD, N_FF), 0.5 * N_FF**-0.5),
        }
        tensors += [(f"blk.{layer}.{name}.weight", value) for name, value in block.items()]
    output = normal((n_vocab, N_EMBD), LOGIT_STD * N_EMBD**-0.5)
    output[token_types != int(gguf.TokenType.NORMAL)] = 0.0
    tensors += [("output_norm.weight", np.ones(N_EMBD, np.float32)), ("output.weight", output)]

    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f"{path.name}.{os.getpid()}.partial")
    writer = gguf.GGUFWriter(str(partial), "llama")
    writer.add_name(f"llm-health tiny llama (seed {seed}, generator {GENERATOR_VERSION})")
    writer.add_file_type(int(gguf.LlamaFileType.ALL_F32))
    writer.add_context_length(N_CTX_TRAIN)
    writer.add_embedding_length(N_EMBD)
    writer.add_block_count(N_LAYER)
    writer.add_feed_forward_length(N_FF)
    writer.add_head_count(N_HEAD)
    writer.add_head_count_kv(N_HEAD_KV)
    writer.add_rope_dimension_count(head_dim)
    writer.add_layer_norm_rms_eps(RMS_EPS)
    writer.add_vocab_size(n_vocab)
    _copy_tokenizer(gguf, vocab, writer)
    for name, value in tensors:
        writer.add_tensor(name, value)
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
    finally:
        writer.close()
    partial.replace(path)


def _copy_tokenizer(gguf: Any, vocab: Any, writer: Any) -> None:
    """Every ``tokenizer.*`` key of the vocabulary file, with its GGUF type."""
    array = gguf.GGUFValueType.ARRAY
    for key, field in vocab.fields.items():
        if not key.startswith(COPIED_PREFIX):
            continue
        kind = field.types[0]
        sub_type = field.types[-1] if kind == array else None
        writer.add_key_value(key, field.contents(), kind, sub_type=sub_type)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--engine",
        type=Path,
        default=os.environ.get("LLM_HEALTH_ENGINE"),
        help="the engine cache directory (build-llama-server.sh's last line); "
        "default $LLM_HEALTH_ENGINE",
    )
    parser.add_argument("--seed", type=int, action="append", required=True)
    args = parser.parse_args(argv)
    if args.engine is None:
        parser.error("give --engine or set LLM_HEALTH_ENGINE")
    for seed in args.seed:
        print(ensure_model(args.engine.resolve(), seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
