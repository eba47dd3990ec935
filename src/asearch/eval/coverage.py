"""Corpus coverage of a QA dataset: does the gold answer appear in the corpus at all, and in the top-k retrieved
for the question itself? A low score can then be told from a missing document (`asearch data check`, and the
line `asearch eval` prints beside its scores).

"Appears" is the DPR / Search-R1 `has_answer` rule on SQuAD-normalised text: some gold's tokens occur
contiguously in the passage's title + text. The corpus-wide test does not scan the store: the BM25 index gives
the passages that hold every indexed term of the gold (a conjunctive query), best first, and those are checked
with the same rule, so a gold is found exactly when a passage has it (up to tokenisation differences between
the analyzer and SQuAD normalisation), at the cost of one query per gold.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asearch.eval.records import QARecord
from asearch.metrics.normalize import normalize_answer

MAX_VERIFY = 1000  # candidate passages checked per gold; a gold with more candidates and no match is "capped"


def has_answer(golds: Sequence[str], text: str) -> bool:
    """Some gold's normalised tokens occur contiguously in the normalised `text`."""
    hay = f" {normalize_answer(text)} "
    return any(g and f" {g} " in hay for g in (normalize_answer(x) for x in golds))


@dataclass
class SourceCoverage:
    """Counts for one data_source (or the whole dataset)."""

    questions: int = 0
    in_corpus: int = 0
    in_topk: int = 0
    capped: int = 0  # absent from the first MAX_VERIFY candidates of every gold: may still be deeper
    unchecked: int = 0  # every gold is stopwords only: no term to look up
    not_in_corpus: list[QARecord] = field(default_factory=list)
    not_retrieved: list[tuple[QARecord, str]] = field(default_factory=list)  # (question, top-1 title)

    def line(self, k: int) -> str:
        n = max(1, self.questions)
        extra = f"; {self.capped} capped, {self.unchecked} unchecked" if self.capped or self.unchecked else ""
        return (
            f"answer in corpus {self.in_corpus / n:.1%} ({self.in_corpus}/{self.questions}), "
            f"in top-{k} for the question {self.in_topk / n:.1%} ({self.in_topk}/{self.questions}){extra}"
        )


@dataclass
class CoverageReport:
    index: str
    method: str
    k: int
    passages: int
    sources: dict[str, SourceCoverage]
    overall: SourceCoverage
    seconds: float

    def lines(self) -> list[str]:
        """One line per data_source (and overall when there are several): what `asearch eval` prints."""
        out = [f"coverage {name or '(no data_source)'}: {c.line(self.k)}" for name, c in self.sources.items()]
        if len(self.sources) > 1:
            out.append(f"coverage overall: {self.overall.line(self.k)}")
        return out

    def miss_lines(self) -> list[str]:
        """Examples of misses per data_source: answers the corpus lacks, and answers it has but did not return."""
        out = []
        for name, c in self.sources.items():
            label = name or "(no data_source)"
            for rec in c.not_in_corpus:
                out.append(f"{label} not in corpus: {rec.id}: {rec.question!r} golds {rec.golds}")
            for rec, top in c.not_retrieved:
                out.append(f"{label} in corpus, not in top-{self.k}: {rec.id}: {rec.question!r} golds {rec.golds} "
                           f"(top hit: {top!r})")  # fmt: skip
        return out


def _gold_in_corpus(bm25: Any, store: Any, gold: str) -> str:
    """'found', 'absent', 'capped' or 'unchecked' for one gold answer over the whole corpus."""
    rows, total = bm25.rows_with_all_terms(gold, MAX_VERIFY)
    if total < 0:
        return "unchecked"
    for passage in store.many(rows) if rows else []:
        if has_answer([gold], f"{passage.title} {passage.text}"):
            return "found"
    return "capped" if total > len(rows) else "absent"


def _in_corpus(bm25: Any, store: Any, golds: Sequence[str]) -> str:
    verdicts = [_gold_in_corpus(bm25, store, g) for g in golds]
    for verdict in ("found", "capped", "absent"):
        if verdict in verdicts:
            return verdict
    return "unchecked"


def check_coverage(
    records: Sequence[QARecord], index: Any, *, k: int = 5, method: str = "bm25", examples: int = 3, batch: int = 256
) -> CoverageReport:
    """Coverage of `records` by the opened `index` (asearch.retrieval.Index), per data_source (a record without
    one counts under its dataset's name, e.g. `nq_test` for FlashRAG's nq_test.jsonl)."""
    t0 = time.perf_counter()
    bm25, retriever, store = index.retriever("bm25"), index.retriever(method), index.passages
    sources: dict[str, SourceCoverage] = {}
    overall = SourceCoverage()
    for start in range(0, len(records), batch):
        part = records[start : start + batch]
        ranked = retriever.search([r.question for r in part], k)
        for rec, hits in zip(part, ranked, strict=True):
            c = sources.setdefault(rec.data_source or rec.dataset, SourceCoverage())
            verdict = _in_corpus(bm25, store, rec.golds)
            retrieved = any(has_answer(rec.golds, f"{h.passage.title} {h.passage.text}") for h in hits)
            for counts in (c, overall):
                counts.questions += 1
                counts.in_corpus += verdict == "found"
                counts.capped += verdict == "capped"
                counts.unchecked += verdict == "unchecked"
                counts.in_topk += retrieved
            if verdict == "absent" and len(c.not_in_corpus) < examples:
                c.not_in_corpus.append(rec)
            elif verdict == "found" and not retrieved and len(c.not_retrieved) < examples:
                c.not_retrieved.append((rec, hits[0].passage.title if hits else "(no hit)"))
    return CoverageReport(
        index=str(index.path), method=method, k=k, passages=len(index), sources=sources, overall=overall,
        seconds=round(time.perf_counter() - t0, 2),
    )  # fmt: skip


def coverage_for_tools(records: Sequence[QARecord], tools_cfg: Any, k: int = 5) -> CoverageReport | None:
    """The coverage of the index an agent's tools searched (tools.index, or tools.corpus's cached index when
    the run built it); None for a retrieval server or the web, whose corpus cannot be scanned from here."""
    from asearch.corpus import open_corpus
    from asearch.retrieval.index import MANIFEST, open_index
    from asearch.tools.build import index_cache_path

    if tools_cfg.server_url is not None or tools_cfg.web is not None or not records:
        return None
    path: Path | None = tools_cfg.index
    if path is None and tools_cfg.corpus is not None:
        path = index_cache_path(open_corpus(tools_cfg.corpus), tools_cfg.build)
    if path is None or not (Path(path) / MANIFEST).exists():  # never built: a scripted run searched nothing
        return None
    with open_index(path) as index:
        return check_coverage(records, index, k=k, method=tools_cfg.method)
