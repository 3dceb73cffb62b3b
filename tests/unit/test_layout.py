"""The layout's pure helpers (slots, sizes, names) and publish's retention rule, by their doctests."""

from __future__ import annotations

import doctest

from orchestrator.lake import layout
from orchestrator.pipeline import publish


def test_doctests_of_the_layout_helpers() -> None:
    result = doctest.testmod(layout)
    assert result.attempted > 10 and result.failed == 0


def test_doctests_of_publish() -> None:
    result = doctest.testmod(publish)
    assert result.attempted >= 2 and result.failed == 0
