"""The overview's staleness section: its panels read the keys the trainer and the loss write, in the bins of
`asearch.metrics.offpolicy`, and it is served hidden until a run logs them (the page's script shows it)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import httpx

from asearch.metrics import offpolicy
from asearch.retrieval.server import serve_in_thread
from asearch.view import ViewConfig, create_app
from asearch.view.pages import STALENESS_CHARTS, esc


def test_staleness_panels_name_what_asearch_rl_writes():
    """A key is either a constant of `asearch.metrics.offpolicy` that asearch.rl uses by name, or a literal
    metric name in asearch.rl's source (read from the source: no torch import)."""
    (rl_dir,) = importlib.util.find_spec("asearch.rl").submodule_search_locations
    source = "\n".join(p.read_text() for p in Path(rl_dir).glob("*.py"))
    constants = {getattr(offpolicy, name): name for name in offpolicy.__all__ if name.isupper()}
    for chart in STALENESS_CHARTS:
        for key in chart.keys:
            written = re.search(rf"\b{constants[key]}\b", source) if key in constants else f'"{key}' in source
            assert written, f"{chart.title}: {key} is not written by asearch.rl"
    histograms = {c.keys[0]: c.bins for c in STALENESS_CHARTS if c.bins}
    assert histograms == {
        offpolicy.VERSIONS_BEHIND_HIST: offpolicy.VERSIONS_BEHIND_LABELS,
        offpolicy.RATIO_HIST: offpolicy.RATIO_LABELS,
    }


def test_the_overview_serves_the_section_with_its_bins(runs_root):
    with serve_in_thread(create_app([runs_root], ViewConfig())) as url:
        page = httpx.get(url + "/", timeout=10).text
    section = page[page.index('<section id="staleness"') :]
    assert section.startswith('<section id="staleness" hidden')  # until the script finds a run with the keys
    assert f'data-bins="{esc("|".join(offpolicy.RATIO_LABELS))}"' in section
    assert f'data-keys="{esc(offpolicy.VERSIONS_BEHIND_HIST)}" data-bins="0|1|2|3|4+"' in section
    assert section.count('<figure class="chart"') == len(STALENESS_CHARTS)
