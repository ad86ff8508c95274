"""What a known-answer probe heard (docs/design.md §14): the answer's text and whatever the
engine showed of how it chose it. Pure data; ``probe.answer`` reads it off the stream and
``engines.verify`` judges it."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Answer:
    """``tokens``: the chosen tokens' texts where the stream names them (logprobs), else
    one entry per streamed piece of text. ``token_ids``/``logprobs``: the chosen tokens'
    ids and log-probabilities where the engine shows them (empty otherwise; a logprob may
    be NaN or infinite: that is what the checks look for). ``first_top``: the alternatives
    the engine ranked for the first token (its top logprobs), empty if not shown.
    ``complete``: the stream ended (a finish reason or [DONE]) within the probe's time.
    """

    text: str
    tokens: tuple[str, ...] = ()
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[float, ...] = ()
    first_top: tuple[str, ...] = ()
    complete: bool = True

    @property
    def first_token(self) -> str | None:
        return self.tokens[0] if self.tokens else None
