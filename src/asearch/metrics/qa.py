"""Answer-level QA metrics: exact match, token F1 (SQuAD v1.1) and cover exact match, max over golds."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from asearch.metrics.normalize import contains_cjk, normalize_answer, tokenize_answer

__all__ = ["QAScores", "cover_exact_match", "exact_match", "f1", "qa_scores"]

Golds = str | Sequence[str]


@dataclass(frozen=True)
class QAScores:
    """The three answer metrics of one prediction, each already the maximum over the golds."""

    em: float
    f1: float
    cem: float


def exact_match(prediction: str | None, golds: Golds) -> float:
    """1.0 if the SQuAD-normalised prediction equals some SQuAD-normalised gold, else 0.0.

    Same as SQuAD v1.1 except that (1) against a CJK gold the comparison is per character, as for F1
    and CEM: "北京 市" and "《北京市》" match "北京市" (Chinese answers carry no word spaces, and their
    punctuation is not ASCII); (2) a None or blank prediction scores 0.0 (SQuAD would give 1.0
    against a gold that normalises to "", like "The").
    """
    gold_list = _gold_list(golds)
    if _is_blank(prediction):
        return 0.0
    pred_tokens = _PredictionTokens(prediction)
    pred = normalize_answer(prediction)
    return max(
        float(pred_tokens.for_gold(g) == tokenize_answer(g, cjk=True))
        if contains_cjk(g)
        else float(pred == normalize_answer(g))
        for g in gold_list
    )


def f1(prediction: str | None, golds: Golds) -> float:
    """Token-multiset F1 (SQuAD v1.1), max over golds; CJK golds are compared per character.

    precision = |P ∩ G| / |P|, recall = |P ∩ G| / |G| with ∩ the multiset intersection, and
    F1 = 2PR / (P + R); 0.0 when the token multisets share nothing. A None or blank prediction
    scores 0.0.
    """
    gold_list = _gold_list(golds)
    if _is_blank(prediction):
        return 0.0
    pred_tokens = _PredictionTokens(prediction)
    return max(
        _f1_tokens(pred_tokens.for_gold(g), tokenize_answer(g, cjk=contains_cjk(g))) for g in gold_list
    )


def cover_exact_match(prediction: str | None, golds: Golds) -> float:
    """1.0 if every token of some normalised gold occurs in the normalised prediction, else 0.0.

    Token containment with multiplicity, in any order and not necessarily contiguous: gold
    "barack obama" is covered by "president barack hussein obama", gold "duran duran" is not
    covered by "duran". CJK golds are tokenised per character. A gold with no tokens after
    normalisation (e.g. "The") is covered only by a prediction that has none either. A None or blank
    prediction scores 0.0.
    """
    gold_list = _gold_list(golds)
    if _is_blank(prediction):
        return 0.0
    pred_tokens = _PredictionTokens(prediction)
    return max(_covers(pred_tokens.for_gold(g), tokenize_answer(g, cjk=contains_cjk(g))) for g in gold_list)


def qa_scores(prediction: str | None, golds: Golds) -> QAScores:
    """EM, F1 and CEM of one prediction in one call (each the max over golds, maybe different golds)."""
    return QAScores(
        em=exact_match(prediction, golds),
        f1=f1(prediction, golds),
        cem=cover_exact_match(prediction, golds),
    )


# ---------------------------------------------------------------------------------------------


class _PredictionTokens:
    """Tokenises the prediction at most once per mode (whitespace or CJK), whatever the gold count."""

    def __init__(self, prediction: str):
        self._prediction = prediction
        self._by_mode: dict[bool, list[str]] = {}

    def for_gold(self, gold: str) -> list[str]:
        # The gold decides the mode: a Chinese gold needs a per-character view of the prediction.
        cjk = contains_cjk(gold)
        if cjk not in self._by_mode:
            self._by_mode[cjk] = tokenize_answer(self._prediction, cjk=cjk)
        return self._by_mode[cjk]


def _f1_tokens(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    # Same operations in the same order as the SQuAD script, so the floats are bit-identical.
    precision = 1.0 * num_same / len(pred_tokens)
    recall = 1.0 * num_same / len(gold_tokens)
    return (2 * precision * recall) / (precision + recall)


def _covers(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    if not gold_tokens:
        return float(not pred_tokens)
    return float(Counter(gold_tokens) <= Counter(pred_tokens))


def _is_blank(prediction: str | None) -> bool:
    if prediction is None:
        return True
    if not isinstance(prediction, str):
        raise TypeError(f"prediction must be a str or None, got {type(prediction).__name__}: {prediction!r}")
    return not prediction.strip()


def _gold_list(golds: Golds) -> list[str]:
    if isinstance(golds, str):
        return [golds]
    if not isinstance(golds, Sequence):
        raise TypeError(f"golds must be a str or a sequence of str, got {type(golds).__name__}: {golds!r}")
    gold_list = list(golds)
    if not gold_list:
        raise ValueError("golds is empty: a prediction needs at least one gold answer to be scored against")
    for i, gold in enumerate(gold_list):
        if not isinstance(gold, str):
            raise TypeError(f"golds[{i}] must be a str, got {type(gold).__name__}: {gold!r}")
    return gold_list
