"""The hardness measurement's search agent: hop plans from recorded statements, played through real BM25."""

from __future__ import annotations

import asyncio
import json

from asearch.synth.expert import plan_for


def _s(entity: str, relation: str, value: str) -> dict:
    return {"text": "", "url": "", "entity": entity, "relation": relation, "value": value}


def test_plan_follows_the_statements_from_a_named_entity_to_the_answer():
    row = {
        "question": "Which university educated the engineer who works for Zentik Books?",
        "answer": ["Girkym Institute"],
        "statements": [
            _s("Hutne Pondyr", "alma_mater", "Girkym Institute"),
            _s("Hutne Pondyr", "employer", "Zentik Books"),
            _s("Hutne Pondyr", "occupation", "engineer"),
        ],
    }
    plan = plan_for(row)
    assert plan is not None
    assert plan.entities == ("Zentik Books", "Hutne Pondyr")
    assert plan.values == ("Hutne Pondyr", "Girkym Institute")
    # an asked attribute is one more hop, read on the asked entity's page
    row = {
        "question": "In what year was the person who works for Zentik Books born?",
        "answer": ["1942"],
        "statements": [
            _s("Hutne Pondyr", "employer", "Zentik Books"),
            _s("Hutne Pondyr", "birth_year", "1942"),
        ],
    }
    plan = plan_for(row)
    assert plan is not None and plan.entities == ("Zentik Books", "Hutne Pondyr")
    assert plan.values == ("Hutne Pondyr", "1942")
    # nothing named in the text: no plan
    row = {
        "question": "Which city was founded in 1367?",
        "answer": ["Velmo"],
        "statements": [_s("Velmo", "founded", "1367")],
    }
    assert plan_for(row) is None


def test_the_expert_reaches_answers_only_through_search(
    graph_questions, char_tokenizer, tmp_path, monkeypatch
):
    from asearch.eval import load_dataset
    from asearch.synth.measure import MeasureSettings, _expert_agent

    monkeypatch.setattr("asearch.models.loading.load_tokenizer", lambda name: char_tokenizer)

    records = load_dataset(graph_questions, name="synth")
    s = MeasureSettings(dataset=str(graph_questions), out=tmp_path, concurrency=4)
    summary, settings = asyncio.run(_expert_agent(s, records, records[0].metadata["corpus"]))
    em = summary.metric("synth", "em")
    planned = len(records) - settings["questions_without_plan"]
    assert planned >= 0.7 * len(records)
    assert 0.3 <= em <= planned / len(records)  # it cannot beat its plans
    results = [json.loads(line) for line in (tmp_path / "agent" / "results.jsonl").open()]
    for r in results:
        if r["em"] == 1.0:  # every right answer came after at least one search
            assert r["counters"].get("search_calls", r["num_turns"] - 1) >= 1
