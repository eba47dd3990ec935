"""The listing pager: links to the neighbouring pages that exist, keeping the filter in the query."""

from __future__ import annotations

from asearch.view.pages import _pager


def test_pager_links_only_to_pages_that_exist_and_keeps_the_filter():
    first = _pager("/synth", {"run": "r1", "q": ""}, 0, matched=45, page_size=20, back="previous", forward="next")
    assert "page 1 / 3" in first and "previous" not in first
    assert 'href="/synth?run=r1&amp;page=1">next →</a>' in first  # the empty q is left out
    middle = _pager("/trajectories", {"run": "r1"}, 1, matched=45, page_size=20, back="newer", forward="older")
    assert "← newer" in middle and "older →" in middle and "page 2 / 3" in middle
    last = _pager("/synth", {}, 2, matched=45, page_size=20, back="previous", forward="next")
    assert "page 3 / 3" in last and "next" not in last
    assert "page 1 / 1" in _pager("/synth", {}, 0, matched=0, page_size=20, back="b", forward="f")
