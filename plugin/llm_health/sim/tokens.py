"""What the simulator "generates": the answer's tokens, their ids and their logprobs.

Nothing is sampled. At any temperature the generated text is ``FaultSpec.answer`` split
into tokens (:func:`split_answer`), repeated verbatim when ``max_tokens`` asks for more
tokens than it has. Each generated token is a :class:`Step`:

- ``token_id``: a stable hash of the token's text into 1..32000 (:func:`token_id`), the
  same in every process; never 0 in normal service.
- ``logprob``: -0.05 for the chosen token.
- ``top``: the candidates ``top_logprobs`` shows, best first: the chosen token itself,
  then ``FaultSpec.top_alternatives`` at -4.0, -5.0, ... (one equal to the chosen token is
  left out). The probabilities of a step sum to less than 1.

The ``garbage_tokens`` fault (vLLM's NaN-logits symptom) generates :data:`GARBAGE_STEP`
every time: the text "!", token id 0, logprob NaN, and NaN runners-up ``"``, ``#``, ``$`` …
(the tokens with ids 0, 1, 2 … in common BPE vocabularies).
"""

from __future__ import annotations

import functools
import math
import re
import zlib
from dataclasses import dataclass

from llm_health.sim.faults import FaultSpec

__all__ = [
    "ALTERNATIVE_LOGPROB",
    "CHOSEN_LOGPROB",
    "GARBAGE_STEP",
    "VOCAB_SIZE",
    "Step",
    "split_answer",
    "steps_for",
    "token_id",
]

#: Token ids of normal tokens are in 1..VOCAB_SIZE.
VOCAB_SIZE = 32000
#: The logprob of every chosen token in normal service.
CHOSEN_LOGPROB = -0.05
#: The logprob of the first alternative; each next one is 1.0 lower.
ALTERNATIVE_LOGPROB = -4.0

_WORD = re.compile(r"\s*\S+")


@dataclass(frozen=True)
class Step:
    """One generated token: its text, id, logprob and top candidates (chosen first)."""

    text: str
    token_id: int
    logprob: float
    top: tuple[tuple[str, float], ...]


def split_answer(answer: str) -> tuple[str, ...]:
    """Split ``answer`` into tokens: each word with the whitespace before it.

    ``" Paris is a city"`` -> ``(" Paris", " is", " a", " city")``. Trailing whitespace
    stays on the last token, so the tokens always join back to ``answer``.
    """
    tokens = _WORD.findall(answer)
    if not tokens:
        raise ValueError(f"answer {answer!r} has no word")
    tokens[-1] += answer[len("".join(tokens)) :]
    return tuple(tokens)


def token_id(text: str) -> int:
    """A stable id for the token ``text``, in 1..VOCAB_SIZE (CRC-32, not ``hash()``)."""
    return zlib.crc32(text.encode("utf-8")) % VOCAB_SIZE + 1


def _step(text: str, alternatives: tuple[str, ...]) -> Step:
    """The step generating ``text``, with ``alternatives`` as its runners-up."""
    others = [alt for alt in alternatives if alt != text]
    runners_up = ((alt, ALTERNATIVE_LOGPROB - rank) for rank, alt in enumerate(others))
    top = ((text, CHOSEN_LOGPROB), *runners_up)
    return Step(text, token_id(text), CHOSEN_LOGPROB, top)


_NAN = math.nan
#: What ``garbage_tokens`` generates, every time: "!" (id 0) with NaN logprobs; its
#: candidates are chr(33) = "!" itself, then the next 19 ASCII characters '"', "#", "$", …
#: (ids 1, 2, 3, …), NaN too: 20 in all, the most vLLM shows.
GARBAGE_STEP = Step("!", 0, _NAN, tuple((chr(33 + i), _NAN) for i in range(20)))


@functools.lru_cache(maxsize=64)
def _answer_steps(answer: str, alternatives: tuple[str, ...]) -> tuple[Step, ...]:
    """The steps of one answer (cached: specs change rarely, requests are many)."""
    return tuple(_step(text, alternatives) for text in split_answer(answer))


def steps_for(spec: FaultSpec, garbage: bool) -> tuple[Step, ...]:
    """The cycle of steps generated under ``spec``: token ``i`` is ``steps[i % len]``."""
    if garbage:
        return (GARBAGE_STEP,)
    return _answer_steps(spec.answer, spec.top_alternatives)
