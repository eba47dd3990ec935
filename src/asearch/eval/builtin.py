"""Built-in evaluation sets made on the fly: k-hop questions over a held-out world, and wiki10k look-ups.

Specs: `world`, `world:hops=2`, `world:seed=1000,n=200,hops=1-3,entities=2000,qseed=0`,
`world:forward=1,answers=entity` (walks without inverse steps, answered by a name), `wiki10k`,
`wiki10k:n=200,seed=0`. Both are pure functions of their spec, so a spec names a fixed question set.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from asearch.errors import AsearchError, ConfigError
from asearch.eval.records import QARecord
from asearch.metrics.normalize import normalize_answer

__all__ = [
    "HELD_OUT_WORLD_SEED",
    "MIN_DESCRIPTION_WORDS",
    "Wiki10kSetSpec",
    "WorldSetSpec",
    "load_builtin",
    "parse_builtin_spec",
    "wiki10k_candidates",
    "wiki10k_questions",
    "world_questions",
]

HELD_OUT_WORLD_SEED = 1000
"""Default world seed for evaluation. Worlds whose seeds differ modulo NAME_PARTITIONS (256) share no
entity names, so 1000 (partition 232) is unseen by any training world whose seed % 256 != 232 —
training on seeds 0..231 is safe, and nothing can be memorised from them."""

DEFAULT_QUESTIONS = 200

MIN_DESCRIPTION_WORDS = 3
"""wiki10k: shorter descriptions ("Racket sport", "Chemical compound") name a category, not one thing."""

_TITLE_STOP_WORDS = frozenset({"of", "and", "in", "on", "for", "to", "by", "with", "from", "at", "or", "as"})
_QUALIFIED = re.compile(r"(.+?) \(([^()]+)\)")


@dataclass(frozen=True)
class WorldSetSpec:
    """`n` questions split evenly over `hops`, from the world `seed` of `entities` entities."""

    seed: int = HELD_OUT_WORLD_SEED
    n: int = DEFAULT_QUESTIONS
    hops: tuple[int, ...] = (1, 2, 3)
    entities: int | None = None  # None: WorldCorpus's default size
    qseed: int = 0  # question-sampling seed: another qseed gives another question set of the same world
    names: int | None = None  # draw names from world `names`'s pool (see WorldCorpus); None: its own
    pages: str = "prose"  # page style of the world the questions are about ("facts": `key value` pages)
    forward: bool = False  # only walks without inverse steps (each hop reads its fact off the page it searched)
    answers: str = "any"  # "entity": only questions answered by an entity's name (no years, numbers, occupations)
    phrasing: str = "natural"  # "keys": each forward step worded with its page's key ("the birthplace of X")


@dataclass(frozen=True)
class Wiki10kSetSpec:
    """`n` description -> title questions, sampled with `seed` from the eligible wiki10k articles."""

    n: int = DEFAULT_QUESTIONS
    seed: int = 0


# --------------------------------------------------------------------------- spec parsing


def _int(spec: str, key: str, raw: str) -> int:
    try:
        return int(raw)
    except ValueError:
        raise AsearchError(f"dataset {spec!r}: {key}={raw!r} is not an integer") from None


def _hops(spec: str, raw: str) -> tuple[int, ...]:
    """`2` -> (2,), `1-3` -> (1, 2, 3), `1+3` -> (1, 3)."""
    if re.fullmatch(r"\d+-\d+", raw):
        lo, hi = (int(x) for x in raw.split("-"))
        hops = tuple(range(lo, hi + 1))
    elif re.fullmatch(r"\d+(\+\d+)*", raw):
        hops = tuple(sorted({int(x) for x in raw.split("+")}))
    else:
        raise AsearchError(f"dataset {spec!r}: hops={raw!r} must look like 2, 1-3 or 1+3")
    if not hops or min(hops) < 1:
        raise AsearchError(f"dataset {spec!r}: hops={raw!r} must be >= 1")
    return hops


def parse_builtin_spec(spec: str) -> WorldSetSpec | Wiki10kSetSpec:
    """`world:seed=7,hops=2` -> WorldSetSpec(seed=7, hops=(2,)); unknown keys name the valid ones."""
    from asearch.corpus.world.questions import PHRASINGS

    kind, _, rest = spec.partition(":")
    valid = {
        "world": ("seed", "n", "hops", "entities", "qseed", "names", "pages", "forward", "answers", "phrasing"),
        "wiki10k": ("n", "seed"),
    }
    if kind not in valid:
        raise AsearchError(f"{spec!r} is not a built-in set (world[:...] or wiki10k[:...])")
    values: dict[str, Any] = {}
    for item in filter(None, (p.strip() for p in rest.split(","))):
        key, eq, raw = item.partition("=")
        if not eq or key not in valid[kind]:
            raise AsearchError(
                f"dataset {spec!r}: bad option {item!r}; {kind} takes key=value options among "
                f"{', '.join(valid[kind])} (e.g. {kind}:n=100)"
            )
        if key == "answers" and raw not in ("any", "entity"):
            raise AsearchError(f"dataset {spec!r}: answers={raw!r} must be 'any' or 'entity'")
        if key == "phrasing" and raw not in PHRASINGS:
            raise AsearchError(f"dataset {spec!r}: phrasing={raw!r} must be {' or '.join(map(repr, PHRASINGS))}")
        if key == "forward" and raw not in ("0", "1"):
            raise AsearchError(f"dataset {spec!r}: forward={raw!r} must be 0 or 1")
        if key == "hops":
            values[key] = _hops(spec, raw)
        elif key in ("pages", "answers", "phrasing"):
            values[key] = raw
        else:
            values[key] = bool(int(raw)) if key == "forward" else _int(spec, key, raw)
    if values.get("n", 1) < 1:
        raise AsearchError(f"dataset {spec!r}: n must be >= 1")
    return WorldSetSpec(**values) if kind == "world" else Wiki10kSetSpec(**values)


def load_builtin(spec: str) -> list[QARecord]:
    """The records of a built-in spec; they carry `dataset=spec` (cached: generation takes ~1 s)."""
    return list(_load_builtin_cached(spec))


@lru_cache(maxsize=8)
def _load_builtin_cached(spec: str) -> tuple[QARecord, ...]:
    parsed = parse_builtin_spec(spec)
    if isinstance(parsed, WorldSetSpec):
        return tuple(world_questions(parsed, dataset=spec))
    return tuple(wiki10k_questions(parsed, dataset=spec))


# --------------------------------------------------------------------------- world


def world_questions(spec: WorldSetSpec = WorldSetSpec(), *, dataset: str = "world") -> list[QARecord]:
    """k-hop questions of one world with their evidence chain (`metadata.evidence`, one entry per hop).

    `metadata.corpus` is the corpus spec the tools must search (`world:seed=1000,entities=2000`).
    """
    from asearch.corpus.world import WorldCorpus, generate_questions

    entities = () if spec.entities is None else (spec.entities,)
    try:
        world = WorldCorpus(spec.seed, *entities, names=spec.names, pages=spec.pages)
    except ConfigError as e:
        raise AsearchError(f"dataset {dataset!r}: {e}") from None
    try:
        questions = generate_questions(
            world, spec.n, hops=spec.hops, seed=spec.qseed, forward_only=spec.forward, entity_answers=spec.answers == "entity",
            phrasing=spec.phrasing,
        )
    except ValueError as e:
        raise AsearchError(f"dataset {dataset!r}: {e}") from None
    records = []
    for q in questions:
        d = q.to_dict()
        metadata = {k: d[k] for k in ("hops", "evidence", "template", "subject", "path")}
        metadata["corpus"] = world.name
        records.append(
            QARecord(id=q.id, question=q.question, golds=list(q.answers), dataset=dataset, metadata=metadata)
        )
    return records


# --------------------------------------------------------------------------- wiki10k


def _title_words(title: str) -> set[str]:
    m = _QUALIFIED.fullmatch(title)
    surface = m.group(1) if m else title
    return {w for w in normalize_answer(surface).split() if len(w) >= 3 and w not in _TITLE_STOP_WORDS}


def wiki10k_candidates(entries: Sequence[Any]) -> tuple[list[Any], Counter[str]]:
    """Entries whose short description identifies them, and the count of each rejection reason.

    Kept: a description of at least MIN_DESCRIPTION_WORDS words, which no other article shares
    (compared after SQuAD normalisation), and which contains no word of the title (ignoring words
    under 3 letters, a few function words and a `(qualifier)`), so the question does not give the
    answer away. Order is the corpus's.
    """
    counts = Counter(normalize_answer(e.description) for e in entries if e.description)
    kept: list[Any] = []
    rejected: Counter[str] = Counter()
    for e in entries:
        description = e.description.strip()
        if not description:
            rejected["no description"] += 1
        elif len(description.split()) < MIN_DESCRIPTION_WORDS:
            rejected["description too short"] += 1
        elif counts[normalize_answer(description)] > 1:
            rejected["description shared with another article"] += 1
        elif _title_words(e.title) & set(normalize_answer(description).split()):
            rejected["description contains the title"] += 1
        else:
            kept.append(e)
    return kept, rejected


def _wiki10k_question(entry: Any) -> QARecord:
    description = entry.description.strip()
    who = "Who" if entry.topic == "People" else "What"
    m = _QUALIFIED.fullmatch(entry.title)
    golds = [entry.title] + ([m.group(1)] if m else [])  # "Mustard (condiment)" also accepts "Mustard"
    return QARecord(
        id=f"wiki10k-{entry.doc_id}",
        question=f'{who} is described on Wikipedia as "{description}"?',
        golds=golds,
        metadata={"url": entry.url, "description": description, "topic": entry.topic, "corpus": "wiki10k"},
    )


def wiki10k_questions(
    spec: Wiki10kSetSpec = Wiki10kSetSpec(), *, dataset: str = "wiki10k", corpus: Any = None
) -> list[QARecord]:
    """`spec.n` questions "What/Who is described on Wikipedia as "<description>"?" -> the article title.

    The description is unique in the corpus (see `wiki10k_candidates`), so each question has exactly
    one answer there; "Who" for articles in the People topic. Sampled with `random.Random` seeded by
    the spec, in sample order; ids are `wiki10k-<page name>`, stable whatever `n` is.
    """
    if corpus is None:
        from asearch.corpus import Wiki10kCorpus

        corpus = Wiki10kCorpus()
    candidates, _ = wiki10k_candidates(corpus.entries())
    if spec.n > len(candidates):
        raise AsearchError(
            f"dataset {dataset!r}: n={spec.n} but wiki10k has {len(candidates)} eligible articles"
        )
    rng = random.Random(f"asearch-wiki10k-questions/{spec.seed}")
    picked = rng.sample(candidates, spec.n)
    return [_wiki10k_question(e).model_copy(update={"dataset": dataset}) for e in picked]
