"""The synthesis page over real `asearch synth` output: answers as text, and edit histories whose changes are
shown against the last kept version, with each step's gate verdict and direct-answer accuracy."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from asearch.files import iter_jsonl
from asearch.view.pages import esc, synth_card, word_diff
from asearch.view.runs import Catalog, SynthRun, synth_question
from conftest import XSS


@pytest.fixture(scope="module")
def rows(runs_root: Path) -> list[dict[str, Any]]:
    return [row for _, row in iter_jsonl(runs_root / "synth" / "questions.jsonl")]


def card(row: dict[str, Any]) -> str:
    return synth_card(1, row, *synth_question(row))


def history_rows(html: str) -> list[str]:
    """The <tr> of each edit step, in order."""
    body = html.split('<table class="edits">', 1)[1].split("<tbody>", 1)[1].split("</tbody>", 1)[0]
    return re.findall(r"<tr[^>]*>.*?</tr>", body, re.S)


def test_the_fixture_is_real_synth_output_with_rejected_steps(rows, runs_root):
    # what the tests below rely on: the real pipeline rejected proposals between kept edits
    assert len(rows) == 8 and all(isinstance(r["answer"], list) for r in rows)
    gates = {s["rejected_by"] for r in rows for s in r["edit_history"] if not s["kept"]}
    assert {"difficulty", "uniqueness"} <= gates
    assert any(len(r["answer"]) > 1 for r in rows) and any(r["aug_answer"] for r in rows)
    assert (runs_root / "synth" / "filter_report.json").is_file()


def test_a_rejected_step_is_not_the_base_of_the_next_diff(rows):
    checked = 0
    for row in rows:
        history = row["edit_history"]
        for j in range(1, len(history) - 1):
            rejected, after = history[j], history[j + 1]
            if rejected["kept"] or not after["kept"]:
                continue
            last_kept = next(i for i in range(j - 1, -1, -1) if history[i]["kept"])
            before = history[last_kept]["question"]
            assert before != rejected["question"] != after["question"]
            trs = history_rows(card(row))
            assert len(trs) == len(history)
            # the rejected proposal is diffed against the version it edited, and shown as rejected
            assert 'class="rejected"' in trs[j] and f"rejected by {rejected['rejected_by']}" in trs[j]
            assert word_diff(before, rejected["question"]) in trs[j]
            # the next step edited the last kept version, not the rejected proposal
            assert word_diff(before, after["question"]) in trs[j + 1]
            assert word_diff(rejected["question"], after["question"]) not in trs[j + 1]
            assert f"(changes vs. #{last_kept + 1})" in trs[j + 1] and 'class="kept"' in trs[j + 1]
            checked += 1
    assert checked >= 2


def test_each_step_shows_operator_verdict_and_accuracy(rows):
    for row in rows:
        trs = history_rows(card(row))
        for tr, step in zip(trs, row["edit_history"], strict=True):
            assert f"<b>{step['action']} " in tr and f"round {step['round']}" in tr
            if step["kept"]:
                assert '<span class="badge correct">kept</span>' in tr
            else:
                assert f'<span class="badge wrong">rejected by {step["rejected_by"]}</span>' in tr
            acc = step["direct_accuracy"]
            cells = re.findall(r"<td>(.*?)</td>", tr, re.S)
            # a proposal the uniqueness gate stopped never reached the solver: no accuracy, not a zero
            shown = f"{acc:g}" if acc is not None else '<span class="muted" title="not measured">–</span>'
            assert cells[4] == shown
            if step["direct_answers"]:
                assert esc(" | ".join(step["direct_answers"])) in tr
            assert esc(step["reason"]) in tr


def test_the_edit_count_is_kept_edits_only(rows, runs_root):
    with_rejections = 0
    for row in rows:
        history = row["edit_history"]
        rejected = sum(1 for s in history if not s["kept"])
        html = card(row)
        expected = f"{row['edits']} kept edits" + (f", {rejected} rejected" if rejected else "")
        assert f"<summary>Edit history: {expected}</summary>" in html
        assert f'<span class="badge">{row["edits"]} kept edits</span>' in html
        with_rejections += rejected > 0
    assert with_rejections >= 3
    run = next(r for r in Catalog([runs_root / "synth"]).all() if isinstance(r, SynthRun))
    assert [r.edits for r in run.questions.rows] == [r["edits"] for r in rows]


def test_answers_are_text_with_their_paraphrases(rows):
    for row in rows:
        html = card(row)
        assert f'<span class="answers">{esc(" | ".join(row["answer"]))}</span>' in html
        assert "[&quot;" not in html.split("<details", 1)[0]  # no JSON list in the heading or answer line
        if row["aug_answer"]:
            assert f"<b>paraphrases:</b> {esc(' | '.join(row['aug_answer']))}" in html
        else:
            assert "paraphrases" not in html
        # the question's own accuracy, not that of a rejected proposal after it
        assert f'<span class="badge">direct-answer acc. {row["direct_accuracy"]:g}</span>' in html


def test_statements_link_only_http_and_escape_everything(rows):
    row = dict(rows[0])
    row["question"] = f"Who is {XSS}?"
    row["answer"] = [XSS, "plain"]
    row["statements"] = [{**row["statements"][0], "url": "javascript:alert(1)"}, *row["statements"][1:]]
    html = card(row)
    assert "<script>" not in html and "<img" not in html and esc(XSS) in html
    assert 'href="javascript' not in html and "javascript:alert(1)" in html  # shown, never a link
    for s in row["statements"][1:]:
        assert f'href="{esc(s["url"])}"' in html and esc(s["text"]) in html
        assert esc(f"{s['entity']} · {s['relation']} · {s['value']}") in html  # the graph fact itself


def test_records_of_other_producers_still_show(rows):
    # plain QA lines (an ASearcher file named on the command line): a string answer, no history
    plain = {"question": "Where is Oslen?", "answer": "Tarnia"}
    html = card(plain)
    assert '<span class="answers">Tarnia</span>' in html and "Edit history" not in html
    # a history without verdicts: every step counts as kept, so each diffs against the one before it
    steps = [
        {"action": "base", "question": "Where was Ada born?"},
        {"action": "fuzz", "question": "Where was a chemist born?"},
    ]
    html = card({"question": steps[-1]["question"], "answer": ["Oslen"], "edit_history": steps})
    assert (
        "Edit history: 1 kept edit</summary>" in html and word_diff(*(s["question"] for s in steps)) in html
    )
