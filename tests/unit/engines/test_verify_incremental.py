"""The incremental consensus of engines.verify (docs/design.md §14.1) against the full
rescan it replaced: both driven by the same random answers, forgets and membership
changes, every judgement list, /status and miss count must be equal.

``ReferenceVerifier`` below is ``Verifier`` as it was before the running vote counts,
copied unchanged (only its private classes renamed): each answer rescanned every vote of
the cluster. Keep it as it is; it is the oracle, not code to maintain.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from unittest.mock import patch

from hypothesis import given, settings
from hypothesis import strategies as st

from llm_health.engines import verify
from llm_health.engines.settings import VerifyConfig
from llm_health.engines.verify import (
    FRESH_EVERY,
    MIN_VOTERS,
    Judgement,
    Verdict,
    Verifier,
    degenerate,
    normalized,
    shown,
)
from llm_health.model.answer import Answer

# --- the reference: Verifier before it kept running counts (do not edit) -------------


@dataclass(slots=True)
class _RefVote:
    text: str
    first: str | None
    first_top: tuple[str, ...]
    at: float
    judged: bool = False


@dataclass(slots=True)
class _RefCluster:
    votes: dict[str, _RefVote] = field(default_factory=dict)
    majority: str | None = None
    majority_first: str | None = None
    note: str = "no answers yet"


class ReferenceVerifier:
    """Per cluster: the latest answer of each endpoint and the running miss counts."""

    def __init__(self) -> None:
        self._clusters: dict[str, _RefCluster] = {}
        self._misses: dict[tuple[str, str], int] = {}
        self._garbage: set[tuple[str, str]] = set()  # last judged answer was garbage

    def judge(
        self,
        cluster: str,
        address: str,
        answer: Answer,
        spec: VerifyConfig,
        unhealthy_after: int,
        now: float,
        members: Collection[str],
    ) -> list[Judgement]:
        """Judge a new answer of ``cluster``/``address``; with consensus, also every other
        endpoint whose answer the majority it completes can now judge. ``members``: the
        cluster's endpoints now (answers of others stop voting)."""
        garbage = degenerate(answer)
        if garbage is not None:
            self._clusters.get(cluster, _RefCluster()).votes.pop(address, None)
            self._garbage.add((cluster, address))
            return [Judgement(address, Verdict.GARBAGE, garbage, down=True)]
        if not answer.complete:
            return [Judgement(address, Verdict.NONE, "answer incomplete within the timeout")]
        was_garbage = (cluster, address) in self._garbage
        self._garbage.discard((cluster, address))
        if spec.pattern is not None:
            found = spec.pattern.search(answer.text) is not None
            miss = f"wrong answer: {shown(answer.text)} does not match /{spec.expect}/"
            return [self._count(cluster, address, found, miss, unhealthy_after)]
        judged = self._consensus(cluster, address, answer, spec, unhealthy_after, now, members)
        if was_garbage and judged == [Judgement(address, Verdict.NONE, judged[0].reason)]:
            return [Judgement(address, Verdict.SOUND, f"no longer garbage; {judged[0].reason}")]
        return judged

    def status(self, cluster: str) -> dict[str, object]:
        """/status: the cluster's reference answer (or why there is none) and the votes."""
        book = self._clusters.get(cluster)
        if book is None:
            return {"majority": None, "note": "no answers yet", "answers": {}}
        return {
            "majority": book.majority,
            "note": book.note,
            "answers": {a: v.text for a, v in sorted(book.votes.items())},
        }

    def misses(self, cluster: str, address: str) -> int:
        return self._misses.get((cluster, address), 0)

    def forget(self, keep: Collection[tuple[str, str]]) -> None:
        """Drop the state of endpoints no longer probed here."""
        for key in [k for k in self._misses if k not in keep]:
            del self._misses[key]
        self._garbage.intersection_update(keep)
        for name, book in self._clusters.items():
            for address in [a for a in book.votes if (name, a) not in keep]:
                del book.votes[address]

    def _consensus(
        self,
        cluster: str,
        address: str,
        answer: Answer,
        spec: VerifyConfig,
        unhealthy_after: int,
        now: float,
        members: Collection[str],
    ) -> list[Judgement]:
        book = self._clusters.setdefault(cluster, _RefCluster())
        book.votes[address] = _RefVote(
            normalized(answer.text), answer.first_token, answer.first_top, now
        )
        horizon = now - FRESH_EVERY * spec.every
        for gone in [a for a, v in book.votes.items() if a not in members or v.at < horizon]:
            del book.votes[gone]
        self._elect(book)
        if book.majority is None:
            return [Judgement(address, Verdict.NONE, book.note)]
        judged = []
        for voter, vote in sorted(book.votes.items()):
            if vote.judged:
                continue
            vote.judged = True
            agrees = vote.text == book.majority or (
                book.majority_first is not None and book.majority_first in vote.first_top
            )
            miss = (
                f"wrong answer: {shown(vote.text)} where {len(book.votes)} endpoints' "
                f"majority says {shown(book.majority)}"
            )
            judged.append(self._count(cluster, voter, agrees, miss, unhealthy_after))
        return judged

    def _elect(self, book: _RefCluster) -> None:
        counts = Counter(vote.text for vote in book.votes.values())
        total = sum(counts.values())
        if total < MIN_VOTERS:
            book.majority, book.majority_first = None, None
            book.note = f"no verdict: {total} answers, at least {MIN_VOTERS} needed"
            return
        text, count = counts.most_common(1)[0]
        if 2 * count <= total:
            if book.majority is not None:  # a new majority must judge everyone again
                for vote in book.votes.values():
                    vote.judged = False
            book.majority, book.majority_first = None, None
            book.note = f"no verdict: no strict majority among {total} answers"
            return
        if text != book.majority:
            for vote in book.votes.values():
                vote.judged = False
        book.majority = text
        book.majority_first = next(
            (v.first for v in book.votes.values() if v.text == text and v.first is not None),
            None,
        )
        book.note = f"{count} of {total} endpoints agree"

    def _count(
        self, cluster: str, address: str, passed: bool, miss: str, unhealthy_after: int
    ) -> Judgement:
        key = (cluster, address)
        if passed:
            self._misses.pop(key, None)
            return Judgement(address, Verdict.PASS, "answer as expected")
        misses = self._misses.get(key, 0) + 1
        self._misses[key] = misses
        if misses >= unhealthy_after:
            checks = f" ({misses} checks)" if misses > 1 else ""
            return Judgement(address, Verdict.MISS, miss + checks, down=True)
        return Judgement(address, Verdict.MISS, miss, recheck=True)


# --- the drive ------------------------------------------------------------------------

CLUSTERS = ("k", "j")
ADDRESSES = ("10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000", "10.0.0.4:8000", "a", "b")
CONSENSUS = VerifyConfig(every="30s", prompt="The capital of France is", max_tokens=3)
SPECS = (
    CONSENSUS,
    VerifyConfig(every="10s", prompt="The capital of France is", max_tokens=3),
    VerifyConfig(every="30s", prompt="p", max_tokens=3, expect="Paris"),
)
ANSWERS = (
    Answer(" Paris is a", (" Paris", " is", " a"), first_top=(" Paris", " Lyon")),
    # the same words with another first token, or none shown: which vote's first token
    # the majority takes depends on the order of the votes
    Answer("Paris  is a", ("Paris", " is", " a"), first_top=("Paris", " Rome")),
    Answer("Paris is a", ()),
    Answer(" Rome is old", (" Rome", " is", " old"), first_top=(" Rome", " Paris")),
    Answer(" Rome is old", (" Rome", " is", " old"), first_top=(" Rome", "Paris")),
    Answer(" Lyon is near", (" Lyon", " is", " near"), first_top=(" Lyon", " Paris")),
    Answer(" Oslo", (" Oslo",)),
    Answer("!!!", ("!",) * 3),  # garbage
    Answer(" Paris", (" Paris",), token_ids=(0,)),  # garbage
    Answer(" Paris", (" Paris",), complete=False),  # no verdict
)


@dataclass(frozen=True)
class Judge:
    cluster: str
    address: str
    answer: Answer
    spec: VerifyConfig
    unhealthy_after: int
    step: float  # the clock moves by this first (now and then backwards)


@dataclass(frozen=True)
class Members:
    """A cluster's members change: a new collection (set, frozenset, list) of all but
    ``addresses``, or the same set without them or with them again, changed in place,
    which the incremental code must notice as well."""

    cluster: str
    how: str
    addresses: frozenset[str]


@dataclass(frozen=True)
class Forget:
    """Endpoints no longer probed here: all but ``gone``."""

    gone: frozenset[tuple[str, str]]

    @property
    def keep(self) -> set[tuple[str, str]]:
        return {(c, a) for c in CLUSTERS for a in ADDRESSES} - self.gone


def judge(endpoint: tuple[str, str], found: Answer, pace: tuple[VerifyConfig, int, float]) -> Judge:
    """(cluster, address) and (spec, unhealthy_after, step) are drawn whole: drawing is
    most of this test's time."""
    return Judge(endpoint[0], endpoint[1], found, *pace)


# Weighted so that majorities form, change and lapse within a few dozen steps: one busy
# cluster, Paris the likeliest answer, mostly consensus, the clock mostly creeping (about
# a dozen answers per 75 s freshness window) with the odd jump to its edge or past it.
STEPS = (0.0,) * 6 + (0.5, 1.0, 2.0, 5.0) * 2 + (25.0, 75.0, 80.0, -3.0)
addresses = st.sampled_from(ADDRESSES)
judges = st.builds(
    judge,
    st.sampled_from([(c, a) for c in CLUSTERS[:1] * 3 + CLUSTERS for a in ADDRESSES]),
    st.sampled_from(ANSWERS[:2] * 3 + ANSWERS[3:5] + ANSWERS),
    st.sampled_from([(s, u, t) for s in SPECS[:1] * 8 + SPECS for u in (1, 2, 3) for t in STEPS]),
)
member_changes = st.builds(
    Members,
    st.sampled_from(CLUSTERS),
    st.sampled_from(("new", "frozen", "list", "remove", "add")),
    st.frozensets(addresses, max_size=2),
)
forgets = st.builds(
    Forget, st.frozensets(st.tuples(st.sampled_from(CLUSTERS), addresses), max_size=2)
)
operations = st.lists(
    st.one_of(*[judges] * 16, member_changes, member_changes, forgets), min_size=20, max_size=80
)


def outcome(
    verifier: Verifier | ReferenceVerifier, op: Judge, now: float, members: Collection[str]
) -> tuple[str, object]:
    """What a judge call returned, or the kind of exception it raised (a sound answer
    after garbage from a non-member raises IndexError in the reference: kept as is)."""
    try:
        judged = verifier.judge(
            op.cluster, op.address, op.answer, op.spec, op.unhealthy_after, now, members
        )
    except Exception as error:  # the oracle compares failures too
        return "raised", type(error)
    return "returned", judged


def observed(verifier: Verifier | ReferenceVerifier) -> object:
    return (
        [verifier.status(c) for c in CLUSTERS],
        [verifier.misses(c, a) for c in CLUSTERS for a in ADDRESSES],
    )


def change(members: dict[str, Collection[str]], op: Members) -> None:
    current, others = members[op.cluster], set(ADDRESSES) - op.addresses
    if op.how == "new":
        members[op.cluster] = others
    elif op.how == "frozen":
        members[op.cluster] = frozenset(others)
    elif op.how == "list":
        members[op.cluster] = sorted(others)
    elif not isinstance(current, set):  # a frozenset or a list: in place on a copy
        members[op.cluster] = set(current)
        change(members, op)
    elif op.how == "remove":
        current.difference_update(op.addresses)
    else:
        current.update(op.addresses)


@settings(max_examples=200, deadline=None)
@given(operations, st.sampled_from((0, 64)))
def test_incremental_consensus_judges_as_the_full_rescan(
    ops: list[Judge | Members | Forget], slack: int
) -> None:
    new, old = Verifier(), ReferenceVerifier()
    members: dict[str, Collection[str]] = {c: set(ADDRESSES) for c in CLUSTERS}
    now = 1000.0
    with patch.object(verify, "AGES_SLACK", slack):  # 0: the vote heap compacts often
        for op in ops:
            if isinstance(op, Judge):
                now += op.step
                members_now = members[op.cluster]
                assert outcome(new, op, now, members_now) == outcome(old, op, now, members_now)
            elif isinstance(op, Members):
                change(members, op)
            else:
                new.forget(op.keep)
                old.forget(op.keep)
            assert observed(new) == observed(old), op


def test_a_cluster_answering_at_one_instant_keeps_its_vote_heap_small() -> None:
    """Replaced votes leave stale heap entries that only expiry would clear; with the
    clock standing still they must be compacted away, and the judging stay the same."""
    new, old = Verifier(), ReferenceVerifier()
    members = set(ADDRESSES)
    for index in range(2_000):
        address = ADDRESSES[index % len(ADDRESSES)]
        found = ANSWERS[(index // 7) % 7]
        assert new.judge("k", address, found, CONSENSUS, 2, 5.0, members) == old.judge(
            "k", address, found, CONSENSUS, 2, 5.0, members
        )
        assert new.status("k") == old.status("k")
    book = new._clusters["k"]
    assert len(book.ages) <= 2 * len(book.votes) + verify.AGES_SLACK + 1


def test_an_endpoint_answering_again_keeps_its_place_among_the_votes() -> None:
    """Votes keep the order endpoints first answered in: the majority's first token is
    that of the first vote giving it (§14.1). Here "a" (first token " Paris") came before
    "b" ("Paris") and answered again since; "c"'s Rome answer, whose top logprobs hold
    " Paris" but not "Paris", passes only if "a" still comes first."""
    new, old = Verifier(), ReferenceVerifier()
    members = {"a", "b", "c"}
    spaced, bare, rome = ANSWERS[0], ANSWERS[1], ANSWERS[3]
    judged = []
    for step, (address, found) in enumerate([("a", spaced), ("b", bare), ("a", spaced)]):
        judged = new.judge("k", address, found, CONSENSUS, 1, float(step), members)
        assert judged == old.judge("k", address, found, CONSENSUS, 1, float(step), members)
    judged = new.judge("k", "c", rome, CONSENSUS, 1, 3.0, members)
    assert judged == old.judge("k", "c", rome, CONSENSUS, 1, 3.0, members)
    assert {j.address: j.verdict for j in judged}["c"] is Verdict.PASS
