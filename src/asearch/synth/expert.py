"""An oracle search agent for graph-synthesised questions: it knows the hops, but must read every value.

`plan_for(row)` turns a synthesised question's recorded statements into the chain of hops a searcher
would follow: from an entity the question names, through the hidden entities, to the answer. The
world's scripted expert (`asearch.agent.expert.WorldExpert`, no deliberate mistakes) then plays the
plan through the real agent loop against the real BM25 search tool: at each hop it searches the
entity's name and may only go on (or answer) when the next value appears in what the search returned.
So its score says how much of the answer a searcher can reach through retrieval when it reasons
perfectly; questions that name no entity get no plan and count as failures.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from typing import Any

from asearch.agent.expert import Plan, WorldExpert
from asearch.corpus.world import RELATIONS


def plan_for(row: Mapping[str, Any]) -> Plan | None:
    """The shortest chain from an entity named in the question to the answer, over its statements.

    Relation statements (subject, relation, object name) are edges between names; the asked attribute,
    when the answer is one, is a last hop from the entity that has it. None when the question names no
    entity connected to the answer.
    """
    statements = row.get("statements") or []
    question, answer = str(row["question"]), str(_first(row["answer"]))
    edges: dict[str, set[str]] = {}
    for s in statements:
        if s.get("relation") in RELATIONS and s.get("entity") and s.get("value"):
            edges.setdefault(s["entity"], set()).add(s["value"])
            edges.setdefault(s["value"], set()).add(s["entity"])
    names = set(edges) | {s["entity"] for s in statements if s.get("entity")}
    named = sorted(n for n in names if n in question and n != answer)
    if answer in edges:  # the answer is an entity of the chain
        target, last = answer, None
    else:  # an attribute of the asked entity: the last statement giving this value
        owner = next((s["entity"] for s in reversed(statements) if str(s.get("value")) == answer), None)
        if owner is None:
            return None
        target, last = owner, answer
    path = _shortest_path(edges, named, target)
    if path is None:
        return None
    hops, values = list(path[:-1]), list(path[1:])
    if last is not None:
        hops, values = [*hops, target], [*values, last]
    return Plan(tuple(hops), tuple(values)) if hops else None


def _first(answer: Any) -> Any:
    return answer[0] if isinstance(answer, list | tuple) else answer


def _shortest_path(edges: Mapping[str, set[str]], starts: Iterable[str], target: str) -> list[str] | None:
    """Breadth-first from every start at once; ties go to the alphabetically first start."""
    parent: dict[str, str | None] = {}
    queue: deque[str] = deque()
    for s in starts:
        parent.setdefault(s, None)
        queue.append(s)
    while queue:
        x = queue.popleft()
        if x == target:
            path = [x]
            while (p := parent[path[-1]]) is not None:
                path.append(p)
            return path[::-1]
        for y in sorted(edges.get(x, ())):
            if y not in parent:
                parent[y] = x
                queue.append(y)
    return None


def synth_expert(rows: Iterable[Mapping[str, Any]], seed: int = 0) -> tuple[WorldExpert, int]:
    """The expert policy for these questions and how many of them got no plan (they will be missed)."""
    plans: dict[str, Plan] = {}
    missing = 0
    for row in rows:
        plan = plan_for(row)
        if plan is None:
            missing += 1
        else:
            plans[str(row["question"])] = plan
    return WorldExpert(plans, p_skip=0.0, p_wrong=0.0, seed=seed), missing
