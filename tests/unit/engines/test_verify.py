"""Known-answer judging (engines.verify): garbage, expect, consensus (table-tested)."""

from __future__ import annotations

import math

import pytest

from llm_health.engines.settings import VerifyConfig
from llm_health.engines.verify import Verdict, Verifier, degenerate
from llm_health.model.answer import Answer

CONSENSUS = VerifyConfig(every="30s", prompt="The capital of France is", max_tokens=3)
PARIS = Answer(" Paris is a", (" Paris", " is", " a"), first_top=(" Paris", " Lyon"))


def answer(text: str, *, top: tuple[str, ...] = (), **extra: object) -> Answer:
    tokens = tuple(f" {w}" for w in text.split())
    return Answer(text, tokens, first_top=top, **extra)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("found", "why"),
    [
        (Answer("!!!", ("!", "!", "!")), "one punctuation character repeated"),
        (Answer(" ! ! !", ("!", "!", "!")), "one punctuation character repeated"),
        (Answer("。。", ("。", "。")), "one punctuation character repeated"),
        (Answer(" Paris", (" Paris",), token_ids=(0,)), "token id 0"),
        (Answer(" Paris", (" Paris",), logprobs=(math.nan,)), "logprob nan"),
        (Answer(" Paris", (" Paris",), logprobs=(-math.inf,)), "logprob -inf"),
        (Answer("", ()), "empty answer"),
        (Answer("  \n", ("  \n",)), "empty answer"),
    ],
)
def test_degenerate_answers_are_garbage(found: Answer, why: str) -> None:
    reason = degenerate(found)
    assert reason is not None and why in reason


@pytest.mark.parametrize(
    "fine",
    [
        PARIS,
        Answer(".", (".",)),  # one punctuation token may be a real answer
        Answer("!?", ("!", "?")),
        Answer(" Paris", (" Paris",), token_ids=(3681,), logprobs=(-0.1,)),
        Answer("", (), complete=False),  # cut before any text: no verdict here
        Answer("aaa", ("a", "a", "a")),  # repeated, but letters
    ],
)
def test_real_answers_are_not_garbage(fine: Answer) -> None:
    assert degenerate(fine) is None


def test_expect_needs_unhealthy_after_misses_then_a_pass_clears() -> None:
    spec = VerifyConfig(every="30s", prompt="p", max_tokens=3, expect="Paris")
    verifier = Verifier()
    (first,) = verifier.judge("c", "a", answer("London is big"), spec, 2, 0.0, {"a"})
    assert first.verdict is Verdict.MISS and first.recheck and not first.down
    (second,) = verifier.judge("c", "a", answer("London is big"), spec, 2, 0.1, {"a"})
    assert second.down and "(2 checks)" in second.reason and "/Paris/" in second.reason
    (passed,) = verifier.judge("c", "a", PARIS, spec, 2, 30.0, {"a"})
    assert passed.verdict is Verdict.PASS and verifier.misses("c", "a") == 0


def test_garbage_is_out_at_once_even_with_expect() -> None:
    spec = VerifyConfig(every="30s", prompt="p", max_tokens=3, expect="!")
    (judged,) = Verifier().judge("c", "a", Answer("!!!", ("!",) * 3), spec, 2, 0.0, {"a"})
    assert judged.verdict is Verdict.GARBAGE and judged.down


def test_an_incomplete_answer_is_no_verdict() -> None:
    cut = Answer(" Paris", (" Paris",), complete=False)
    (judged,) = Verifier().judge("c", "a", cut, CONSENSUS, 2, 0.0, {"a"})
    assert judged.verdict is Verdict.NONE


def test_no_verdict_below_three_answers_then_the_majority_judges_everyone() -> None:
    verifier, members = Verifier(), {"a", "b", "c"}
    (one,) = verifier.judge("k", "a", PARIS, CONSENSUS, 1, 0.0, members)
    assert one.verdict is Verdict.NONE and "at least 3" in one.reason
    verifier.judge("k", "b", answer("Rome is old", top=(" Milan",)), CONSENSUS, 1, 0.1, members)
    judged = verifier.judge("k", "c", PARIS, CONSENSUS, 1, 0.2, members)
    verdicts = {j.address: j for j in judged}
    assert set(verdicts) == {"a", "b", "c"}
    assert verdicts["a"].verdict is Verdict.PASS and verdicts["c"].verdict is Verdict.PASS
    assert verdicts["b"].down and "majority says 'Paris is a'" in verdicts["b"].reason
    assert verifier.status("k")["majority"] == "Paris is a"


def test_a_differing_answer_whose_top_logprobs_hold_the_majority_first_token_passes() -> None:
    verifier, members = Verifier(), {"a", "b", "c"}
    verifier.judge("k", "a", PARIS, CONSENSUS, 1, 0.0, members)
    verifier.judge("k", "b", PARIS, CONSENSUS, 1, 0.0, members)
    judged = verifier.judge(
        "k", "c", answer("Lyon is near", top=(" Lyon", " Paris")), CONSENSUS, 1, 0.0, members
    )
    assert {j.address: j.verdict for j in judged}["c"] is Verdict.PASS


def test_no_strict_majority_is_no_verdict() -> None:
    verifier, members = Verifier(), {"a", "b", "c", "d"}
    verifier.judge("k", "a", PARIS, CONSENSUS, 1, 0.0, members)
    verifier.judge("k", "b", PARIS, CONSENSUS, 1, 0.0, members)
    verifier.judge("k", "c", answer("Rome is old"), CONSENSUS, 1, 0.0, members)
    (judged,) = verifier.judge("k", "d", answer("Oslo is cold"), CONSENSUS, 1, 0.0, members)
    assert judged.verdict is Verdict.NONE and "no strict majority" in judged.reason


def test_old_answers_and_departed_endpoints_stop_voting() -> None:
    verifier = Verifier()
    verifier.judge("k", "a", PARIS, CONSENSUS, 1, 0.0, {"a", "b", "c"})
    verifier.judge("k", "b", PARIS, CONSENSUS, 1, 0.0, {"a", "b", "c"})
    # 100 s later (beyond 2.5 × every), a's and b's answers are too old to vote.
    (judged,) = verifier.judge(
        "k", "c", answer("Rome is old"), CONSENSUS, 1, 100.0, {"a", "b", "c"}
    )
    assert judged.verdict is Verdict.NONE
    verifier.judge("k", "a", PARIS, CONSENSUS, 1, 100.0, {"a", "c"})
    assert set(verifier.status("k")["answers"]) == {"a", "c"}  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("sequence", "verdicts"),
    [
        # one endpoint (llm-health agent's engine): no majority ever, but garbage lifts
        (["!!!", "Paris is a"], [Verdict.GARBAGE, Verdict.SOUND]),
        (["!!!", "Paris is a", "Paris is a"], [Verdict.GARBAGE, Verdict.SOUND, Verdict.NONE]),
        (["Paris is a", "Paris is a"], [Verdict.NONE, Verdict.NONE]),  # nothing to lift
        (["!!!", "cut", "Paris is a"], [Verdict.GARBAGE, Verdict.NONE, Verdict.SOUND]),
        (["!!!", "!!!", "Paris is a"], [Verdict.GARBAGE, Verdict.GARBAGE, Verdict.SOUND]),
    ],
)
def test_a_sound_answer_after_garbage_lifts_the_hold_without_a_majority(
    sequence: list[str], verdicts: list[Verdict]
) -> None:
    verifier, seen = Verifier(), []
    for index, text in enumerate(sequence):
        if text == "!!!":
            found = Answer("!!!", ("!",) * 3)
        elif text == "cut":
            found = Answer(" Paris", (" Paris",), complete=False)  # no proof either way
        else:
            found = PARIS
        (judged,) = verifier.judge("c", "a", found, CONSENSUS, 2, float(index), {"a"})
        seen.append(judged.verdict)
    assert seen == verdicts


def test_with_a_majority_a_sound_answer_is_judged_as_usual() -> None:
    verifier, members = Verifier(), {"a", "b", "c"}
    verifier.judge("k", "b", PARIS, CONSENSUS, 1, 0.0, members)
    verifier.judge("k", "c", PARIS, CONSENSUS, 1, 0.0, members)
    verifier.judge("k", "a", Answer("!!!", ("!",) * 3), CONSENSUS, 1, 0.0, members)
    judged = verifier.judge("k", "a", PARIS, CONSENSUS, 1, 1.0, members)
    assert [j.verdict for j in judged if j.address == "a"] == [Verdict.PASS]
