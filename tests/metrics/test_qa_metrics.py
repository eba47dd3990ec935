"""Hand-computed EM / F1 / CEM (CJK included), answer extraction, input errors and import cost."""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from asearch.metrics import (
    QAScores,
    contains_cjk,
    cover_exact_match,
    exact_match,
    extract_answer,
    f1,
    normalize_answer,
    qa_scores,
    tokenize_answer,
)

# --- normalisation -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "normalised"),
    [
        ("The  Quick, Brown-Fox!", "quick brownfox"),
        ("  An apple a day ", "apple day"),
        ("theater", "theater"),
        ("U.S.A.", "usa"),
        ("Café\u00a0Münster", "café münster"),
        ("", ""),
        ("The", ""),
    ],
)
def test_normalize_answer(raw, normalised):
    assert normalize_answer(raw) == normalised


def test_tokenize_answer_cjk_splits_characters_and_keeps_latin_runs():
    # NFKC folds the full-width "２" to "2"; "《》，" are Unicode punctuation and become spaces.
    assert tokenize_answer("《红楼梦》的作者，曹雪芹 iPad２", cjk=True) == [
        "红", "楼", "梦", "的", "作", "者", "曹", "雪", "芹", "ipad2",
    ]  # fmt: skip
    assert tokenize_answer("2008年北京", cjk=True) == ["2008", "年", "北", "京"]
    assert tokenize_answer("Tom，Jerry", cjk=True) == ["tom", "jerry"]
    assert tokenize_answer("2008年北京") == ["2008年北京"]  # default is plain SQuAD


@pytest.mark.parametrize(
    ("text", "expected"),
    [("abc", False), ("東京", True), ("서울", True), ("カタカナ", True), ("ひらがな", True),
     ("\U00020000", True), ("，。《》", False), ("Ünïcödé", False), ("", False)],
)  # fmt: skip
def test_contains_cjk(text, expected):
    assert contains_cjk(text) is expected


# --- exact match -------------------------------------------------------------------------------


def test_exact_match_hand_examples():
    assert exact_match("The Cat!", "cat") == 1.0
    assert exact_match("cats", "cat") == 0.0
    assert exact_match("Paris, France", ["London", "paris france"]) == 1.0
    assert exact_match("Paris", ["London", "Berlin"]) == 0.0
    assert exact_match("1,000", "1000") == 1.0
    # CJK golds are compared per character: spacing and CJK punctuation do not count, characters do.
    assert exact_match("北京市", "北京市") == 1.0
    assert exact_match("北京 市", "北京市") == 1.0
    assert exact_match("《红楼梦》", "红楼梦") == 1.0 and exact_match("北京。", "北京") == 1.0
    assert exact_match("北京", "北京市") == 0.0 and exact_match("北京市", ["上海", "北京市"]) == 1.0
    assert exact_match("２００８年", "2008年") == 1.0  # full-width digits fold to ASCII


# --- F1 ----------------------------------------------------------------------------------------


def test_f1_hand_examples():
    # pred tokens [cat, sat, on, mat] (4), gold [cat, on, mat] (3): P = 3/4, R = 1, F1 = 6/7.
    assert f1("the cat sat on the mat", "a cat on a mat") == pytest.approx(6 / 7)
    # multiset: pred [new, york, new, york], gold [new, york]: common 2, P = 1/2, R = 1, F1 = 2/3
    # (a token-set F1 would say 1.0 here).
    assert f1("new york new york", "New York") == pytest.approx(2 / 3)
    # gold [duran, duran], pred [duran]: P = 1, R = 1/2 -> 2/3.
    assert f1("Duran", "Duran Duran") == pytest.approx(2 / 3)
    assert f1("Barack Obama", "Obama") == pytest.approx(2 / 3)
    assert f1("London", "Paris") == 0.0
    # max over golds: "paris" gives 1.0, "paris france" gives 2/3.
    assert f1("Paris", ["Paris France", "paris"]) == 1.0
    assert f1("Paris", ["Paris France", "Lyon"]) == pytest.approx(2 / 3)


def test_f1_cjk_gold_is_per_character():
    # gold [北, 京, 市], pred [北, 京]: P = 1, R = 2/3, F1 = 0.8 (whole-token SQuAD F1 would be 0).
    assert f1("北京", "北京市") == pytest.approx(0.8)
    assert f1("《红楼梦》", "红楼梦") == 1.0
    assert f1("2008 年", "2008年") == 1.0
    # full-width letters fold under NFKC: pred [ipad, 的, 价, 格], gold [ipad, 价, 格] -> 6/7.
    assert f1("ｉＰａｄ的价格", "iPad价格") == pytest.approx(6 / 7)
    # Japanese and Korean: 5 characters vs 2 -> P = 2/5, R = 1, F1 = 4/7.
    assert f1("東京タワー", "東京") == pytest.approx(4 / 7)
    assert f1("서울특별시", "서울") == pytest.approx(4 / 7)
    # mixed golds: "Beijing" scores 0 by SQuAD rules, "北京" scores 2 * (2/3 * 1) / (5/3) = 0.8.
    assert f1("北京市", ["Beijing", "北京"]) == pytest.approx(0.8)
    # the gold decides the mode: against a Latin gold a CJK prediction is one SQuAD token.
    assert f1("北京市 Beijing", "Beijing") == pytest.approx(2 / 3)
    assert f1("北京市", "Beijing") == 0.0


# --- cover exact match -------------------------------------------------------------------------


def test_cover_exact_match_hand_examples():
    assert cover_exact_match("President Barack Hussein Obama", "Barack Obama") == 1.0  # not contiguous
    assert cover_exact_match("Obama, Barack", "Barack Obama") == 1.0  # order free
    assert cover_exact_match("Obama", "Barack Obama") == 0.0
    assert cover_exact_match("Duran", "Duran Duran") == 0.0  # multiplicity counts
    assert cover_exact_match("Duran Duran Duran", "Duran Duran") == 1.0
    assert cover_exact_match("The answer is Paris.", ["London", "Paris"]) == 1.0
    assert cover_exact_match("The answer is Paris.", ["London", "Paris France"]) == 0.0
    # a gold with no tokens is covered only by a prediction with none
    assert cover_exact_match("a", "The") == 1.0
    assert cover_exact_match("x", "The") == 0.0


def test_cover_exact_match_cjk():
    assert cover_exact_match("中华人民共和国的首都是北京。", "北京") == 1.0
    assert cover_exact_match("北京", "北京市") == 0.0
    assert cover_exact_match("市北京", "北京市") == 1.0  # containment, not substring


# --- blanks, errors, combined ------------------------------------------------------------------


@pytest.mark.parametrize("prediction", [None, "", "   ", "\n\t"])
@pytest.mark.parametrize("gold", ["Paris", "The", ["a", "Paris"]])
def test_blank_predictions_score_zero(prediction, gold):
    # SQuAD would give EM 1 for "" against "The"; asearch treats a blank answer as no answer.
    assert exact_match(prediction, gold) == 0.0
    assert f1(prediction, gold) == 0.0
    assert cover_exact_match(prediction, gold) == 0.0


@pytest.mark.parametrize("metric", [exact_match, f1, cover_exact_match, qa_scores])
def test_input_errors_are_clear(metric):
    with pytest.raises(ValueError, match="golds is empty"):
        metric("Paris", [])
    with pytest.raises(TypeError, match=r"golds\[1\] must be a str, got NoneType"):
        metric("Paris", ["Paris", None])
    with pytest.raises(TypeError, match="golds must be a str or a sequence of str, got int"):
        metric("Paris", 1984)
    with pytest.raises(TypeError, match="prediction must be a str or None, got list"):
        metric(["Paris"], "Paris")
    # an empty gold list is an error even when the prediction is blank
    with pytest.raises(ValueError, match="golds is empty"):
        metric(None, [])


def test_qa_scores_combines_the_three():
    scores = qa_scores("President Barack Hussein Obama", ["Barack Obama", "Obama"])
    # F1: "barack obama" gives P = 2/4, R = 1 -> 2/3; "obama" gives P = 1/4, R = 1 -> 0.4.
    assert scores == QAScores(em=0.0, f1=pytest.approx(2 / 3), cem=1.0)


_ANY_TEXT = st.lists(
    st.sampled_from(list("ab the,.!-'  \t\n東京北市，《》ＡＢ１ñé서울") + ["the ", "a "]), max_size=20
).map("".join)


@settings(max_examples=300, deadline=None)
@given(prediction=st.one_of(st.none(), _ANY_TEXT), golds=st.lists(_ANY_TEXT, min_size=1, max_size=3))
def test_scores_are_in_unit_interval_and_consistent(prediction, golds):
    em, f, cem = exact_match(prediction, golds), f1(prediction, golds), cover_exact_match(prediction, golds)
    assert em in (0.0, 1.0) and cem in (0.0, 1.0)
    assert 0.0 <= f <= 1.0
    if em == 1.0:
        # an exact match with a gold that has tokens is also a full F1 and a cover, unless the
        # matching gold is CJK, where F1/CEM use another tokenisation (checked separately above)
        matching = [g for g in golds if normalize_answer(g) == normalize_answer(prediction)]
        if any(normalize_answer(g) and not contains_cjk(g) for g in matching):
            assert f == 1.0 and cem == 1.0
    if f == 1.0:
        assert cem == 1.0


# --- extract_answer ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("<answer>Paris</answer>", "Paris"),
        ("<think>hmm</think>\n<answer>\n  Paris, France \n</answer>\n", "Paris, France"),
        ("<answer>London</answer> wait... <answer>Paris</answer>", "Paris"),
        ("<ANSWER>Paris</Answer>", "Paris"),
        ("< answer >Paris</ answer >", "Paris"),
        ("<answer>line one\nline two</answer>", "line one\nline two"),
        ("<answer></answer>", ""),
        ("<answer>Paris</answer> then <answer>Lon", "Paris"),  # truncated last block does not count
        ("<answer>draft <answer>final</answer>", "final"),
        ("<think>I will write <answer>x</answer> later</think><answer>Paris</answer>", "Paris"),
        ("<answer><b>bold</b></answer>", "<b>bold</b>"),
        ("no tags at all", None),
        ("<answer>never closed", None),
        ("Paris</answer>", None),
        ("</answer><answer>", None),
        ("", None),
        (None, None),
        ("<answers>x</answers>", None),
    ],
)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


def test_extracted_answer_scores_end_to_end():
    generation = "<think>The tower is in Paris.</think>\n<answer> The city of Paris </answer>"
    assert f1(extract_answer(generation), ["Paris"]) == pytest.approx(0.5)  # [city, of, paris]
    assert exact_match(extract_answer("I give up."), ["Paris"]) == 0.0  # None answer -> 0, no crash


def test_import_is_cheap():
    """Rewards run in worker processes: importing the metrics must not pull numpy, torch or pydantic."""
    probe = "import sys, asearch.metrics; print(sorted(m for m in ('numpy', 'torch', 'pydantic') if m in sys.modules))"
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "[]"
