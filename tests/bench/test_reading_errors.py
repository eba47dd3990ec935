"""bench/reading_errors.py: its reading-turn classes on hand-made turns."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from asearch.agent.trajectory import Trajectory, Turn

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "reading_errors.py"


def _module():
    spec = importlib.util.spec_from_file_location("reading_errors_bench", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


CHUNK = "[page 1/3 of https://world.example/wiki/Vokim_Institute]\nVokim Institute : university\nheadquarters Vainny\nrival Gainnik"


def test_each_reading_class():
    classify = _module().classify
    assert classify("headquarters Vainny", CHUNK, "headquarters", "Vainny") == "found"
    assert classify("headquarters none", CHUNK, "headquarters", "Vainny") == "missed line"
    assert classify("headquarters Gainnik", CHUNK, "headquarters", "Vainny") == "wrong value on line"
    assert classify("founder none", CHUNK, "founder", "Ada Varn") == "no line: said no"
    assert classify("founder Gainnik", CHUNK, "founder", "Ada Varn") == "no line: invented"


def test_an_episodes_first_mistake_and_hops():
    evidence = [{"entity": "Vokim Institute", "statement": "headquarters Vainny", "value": "Vainny"}, {"statement": "capital Oslen", "value": "Oslen"}]
    turns = [
        Turn(kind="act", output_text="<access>u</access>", action="access", observation=CHUNK),
        Turn(kind="read", output_text=" headquarters Vainny</summary>"),
        Turn(kind="act", output_text="<access>v</access>", action="access", observation="[page 1/2 of v]\ncapital Oslen"),
        Turn(kind="read", output_text=" capital none</summary>"),
        Turn(kind="act", output_text="<answer>Vainny</answer>", action="answer"),
    ]
    traj = Trajectory(id="t", question="q", style="search-r1", action_tags=[], turns=turns)
    reads, first = _module().episode_reads(traj, {"metadata": {"evidence": evidence}})
    assert reads == [(1, "found"), (2, "missed line")]
    assert first == "missed line (hop 2)"
