"""The one bearer-token check (core/tokens.py)."""

from __future__ import annotations

import pytest

from llm_health.core.tokens import bearer_matches, expected_value, presented_value


def test_exact_bearer_value_matches_and_nothing_else() -> None:
    expected = expected_value("s3cret-token")
    assert bearer_matches([("authorization", "Bearer s3cret-token")], expected)
    assert bearer_matches([("authorization", b"Bearer s3cret-token")], expected)
    for wrong in ("Bearer s3cret", "Bearer s3cret-token ", "s3cret-token", "bearer s3cret-token"):
        assert not bearer_matches([("authorization", wrong)], expected), wrong
    assert not bearer_matches([("x-other", "Bearer s3cret-token")], expected)
    assert not bearer_matches(None, expected)


def test_first_authorization_value_counts() -> None:
    metadata = [("authorization", "Bearer a"), ("authorization", "Bearer b")]
    assert presented_value(metadata) == b"Bearer a"


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError, match="empty token"):
        expected_value("")
