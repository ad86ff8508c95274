"""Judging known-answer probes (pure; docs/design.md §14). No I/O, clock passed in.

- ``degenerate``: output no working model produces: every token the same punctuation
  character (vLLM streams "!!!!" after NaN logits), token id 0, a non-finite logprob, an
  empty answer. One such answer is enough (cause "garbage output").
- With ``expect`` (a regex): an answer it does not find is a miss; ``unhealthy_after``
  misses in a row (the next check comes after ``confirm_delay``) take the endpoint out.
- Without: the reference is the answer a strict majority of the cluster's recent answers
  gives, when at least ``MIN_VOTERS`` endpoints answered. An endpoint that answers
  otherwise, and whose own top logprobs for the first token do not contain the majority's
  first token either, misses. No majority: no verdict (said in /status), except that the
  first sound answer after garbage is ``SOUND``: it lifts the garbage hold, which would
  otherwise wait for a majority that a cluster of one or two endpoints (``llm-health
  agent``'s one engine) never has.
"""

from __future__ import annotations

import enum
import heapq
import unicodedata
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field

from llm_health.engines.settings import VerifyConfig
from llm_health.model.answer import Answer
from llm_health.model.redact import printable_line

MIN_VOTERS = 3
FRESH_EVERY = 2.5  # an answer older than this many ``every`` no longer votes
SHOWN_CHARS = 60  # of an answer, in reasons
AGES_SLACK = 64  # stale entries a cluster's vote heap may hold beyond twice its votes


class Verdict(enum.Enum):
    GARBAGE = "garbage"  # out at once
    MISS = "miss"  # counts toward unhealthy_after
    PASS = "pass"  # clears misses and any hold
    SOUND = "sound"  # not garbage after garbage, no majority to judge it: lifts the hold
    NONE = "none"  # no verdict (no majority yet, incomplete answer)


@dataclass(frozen=True, slots=True)
class Judgement:
    """One endpoint's answer judged. ``down``: hold it UNHEALTHY now (``reason`` says
    why); ``recheck``: verify again after ``confirm_delay`` rather than ``every``."""

    address: str
    verdict: Verdict
    reason: str
    down: bool = False
    recheck: bool = False


def shown(text: str) -> str:
    """An answer as reasons quote it: one printable line, clipped."""
    return repr(printable_line(text, SHOWN_CHARS))


def degenerate(answer: Answer) -> str | None:
    """Why ``answer`` is garbage, or None. Judged on what arrived, complete or not."""
    if 0 in answer.token_ids:
        return f"garbage output: {shown(answer.text)} (token id 0)"
    bad = [v for v in answer.logprobs if v != v or v in (float("inf"), float("-inf"))]
    if bad:
        return f"garbage output: {shown(answer.text)} (logprob {bad[0]})"
    visible = "".join(answer.text.split())
    if answer.complete and not visible:
        return "garbage output: empty answer"
    if len(visible) >= 2 and len(set(visible)) == 1 and _punctuation(visible[0]):
        return f"garbage output: {shown(answer.text)} (one punctuation character repeated)"
    return None


def _punctuation(char: str) -> bool:
    return unicodedata.category(char)[0] in ("P", "S")


def normalized(text: str) -> str:
    """Answers compare on their words: white space runs are one space, ends trimmed."""
    return " ".join(text.split())


@dataclass(slots=True)
class _Vote:
    text: str
    first: str | None
    first_top: tuple[str, ...]
    at: float


@dataclass(slots=True)
class _Cluster:
    """The latest vote of each endpoint, and what keeps a known-answer probe's cost to
    what it changes rather than the cluster's size (a serve process judges ~1,000
    endpoints): ``counts``, the votes' texts counted; ``ages``, a heap of (at, address)
    per vote cast, so expiry looks only at the oldest (an entry whose vote was since
    replaced or dropped is skipped when it comes up); ``unjudged``, the voters the
    majority has not judged yet.

    A replaced vote keeps its place in ``votes``: the majority's first token is that of
    the first vote in this order (``Verifier._elect``)."""

    votes: dict[str, _Vote] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    ages: list[tuple[float, str]] = field(default_factory=list)
    unjudged: set[str] = field(default_factory=set)
    majority: str | None = None
    majority_first: str | None = None
    note: str = "no answers yet"

    def cast(self, address: str, vote: _Vote) -> None:
        """``address``'s new vote, in place of its last one."""
        old = self.votes.get(address)
        if old is not None:
            self._uncount(old.text)
        self.votes[address] = vote
        self.counts[vote.text] += 1
        self.unjudged.add(address)
        heapq.heappush(self.ages, (vote.at, address))
        if len(self.ages) > 2 * len(self.votes) + AGES_SLACK:  # stale entries piled up
            self.ages = [(v.at, a) for a, v in self.votes.items()]
            heapq.heapify(self.ages)

    def drop(self, address: str) -> None:
        vote = self.votes.pop(address, None)
        if vote is not None:
            self._uncount(vote.text)
            self.unjudged.discard(address)

    def expire(self, horizon: float) -> None:
        """Drop the votes cast before ``horizon``: they no longer vote (§14.1)."""
        while self.ages and self.ages[0][0] < horizon:
            at, address = heapq.heappop(self.ages)
            vote = self.votes.get(address)
            if vote is not None and vote.at == at:  # else replaced, or dropped already
                self.drop(address)

    def rejudge(self) -> None:
        """A new majority judges everyone again."""
        self.unjudged = set(self.votes)

    def _uncount(self, text: str) -> None:
        self.counts[text] -= 1
        if not self.counts[text]:  # most_common looks at the texts still voted only
            del self.counts[text]


def _outsiders(votes: dict[str, _Vote], members: Collection[str]) -> list[str]:
    """Voters no longer among ``members``. Asked on every answer (``members`` may have
    changed, even in place); with a set the usual answer, nobody, is one C-level pass."""
    if isinstance(members, (set, frozenset)) and votes.keys() <= members:
        return []
    return [a for a in votes if a not in members]


class Verifier:
    """Per cluster: the latest answer of each endpoint and the running miss counts."""

    def __init__(self) -> None:
        self._clusters: dict[str, _Cluster] = {}
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
            book = self._clusters.get(cluster)
            if book is not None:
                book.drop(address)
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
                book.drop(address)

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
        book = self._clusters.setdefault(cluster, _Cluster())
        book.cast(
            address, _Vote(normalized(answer.text), answer.first_token, answer.first_top, now)
        )
        book.expire(now - FRESH_EVERY * spec.every)
        for gone in _outsiders(book.votes, members):
            book.drop(gone)
        self._elect(book)
        if book.majority is None:
            return [Judgement(address, Verdict.NONE, book.note)]
        voters = sorted(book.unjudged)
        book.unjudged.clear()
        judged = []
        for voter in voters:
            vote = book.votes[voter]
            agrees = vote.text == book.majority or (
                book.majority_first is not None and book.majority_first in vote.first_top
            )
            miss = (
                f"wrong answer: {shown(vote.text)} where {len(book.votes)} endpoints' "
                f"majority says {shown(book.majority)}"
            )
            judged.append(self._count(cluster, voter, agrees, miss, unhealthy_after))
        return judged

    def _elect(self, book: _Cluster) -> None:
        total = len(book.votes)
        if total < MIN_VOTERS:
            book.majority, book.majority_first = None, None
            book.note = f"no verdict: {total} answers, at least {MIN_VOTERS} needed"
            return
        # Ties pick any text: a tie at the top is no strict majority.
        text, count = book.counts.most_common(1)[0]
        if 2 * count <= total:
            if book.majority is not None:  # a new majority must judge everyone again
                book.rejudge()
            book.majority, book.majority_first = None, None
            book.note = f"no verdict: no strict majority among {total} answers"
            return
        if text != book.majority:
            book.rejudge()
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
