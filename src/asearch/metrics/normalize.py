"""Answer normalisation and tokenisation: SQuAD v1.1 rules, plus a per-character rule for CJK golds.

Also `extract_answer`, which pulls the final `<answer>...</answer>` block out of a generation.
"""

from __future__ import annotations

import re
import string
import unicodedata

__all__ = ["contains_cjk", "extract_answer", "normalize_answer", "tokenize_answer"]

# Exactly SQuAD v1.1: ASCII punctuation is deleted (not replaced by a space), so "co-op" -> "coop".
_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")

# Scripts written without spaces between words (plus Hangul, which KorQuAD-style evaluation also
# scores per syllable): Han ideographs incl. extensions and compatibility forms, kana, Hangul.
_CJK_RANGES = (
    "\u3040-\u309f"  # Hiragana
    "\u30a0-\u30ff"  # Katakana
    "\u31f0-\u31ff"  # Katakana phonetic extensions
    "\u3400-\u4dbf"  # CJK Unified Ideographs Extension A
    "\u4e00-\u9fff"  # CJK Unified Ideographs
    "\uac00-\ud7af"  # Hangul syllables
    "\uf900-\ufaff"  # CJK Compatibility Ideographs
    "\U00020000-\U0003134f"  # Extensions B-G and compatibility supplement
)
_CJK_CHAR = re.compile(f"[{_CJK_RANGES}]")
# One token = one CJK character, or a maximal run of other non-space characters.
_CJK_TOKEN = re.compile(f"[{_CJK_RANGES}]|[^\\s{_CJK_RANGES}]+")

_ANSWER_OPEN = re.compile(r"<\s*answer\s*>", re.IGNORECASE)
_ANSWER_CLOSE = re.compile(r"<\s*/\s*answer\s*>", re.IGNORECASE)


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lowercase, delete ASCII punctuation, drop a/an/the, collapse spaces.

    Deliberately identical to the official script (no NFKC, no Unicode punctuation), so EM and F1
    computed on it equal SQuAD's on every input.
    """
    text = s.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def contains_cjk(s: str) -> bool:
    """True when `s` holds at least one Han, kana or Hangul character."""
    return _CJK_CHAR.search(s) is not None


def tokenize_answer(s: str, *, cjk: bool = False) -> list[str]:
    """Tokens of a normalised answer: SQuAD whitespace tokens, or the CJK per-character form.

    With `cjk=True` (used when the gold contains CJK) the text is first NFKC-folded (full-width
    letters and digits become ASCII), non-ASCII punctuation ("，", "《", "》", "、") becomes a
    space, SQuAD normalisation runs, and the text is split so that each CJK character is one token
    while runs of other characters ("2008", "ipad") stay whole.
    """
    if not cjk:
        return normalize_answer(s).split()
    # Unicode punctuation becomes a space *before* NFKC, which would otherwise turn "，" into ","
    # and let SQuAD's deletion glue "Tom，Jerry" into one token; a second pass catches any that
    # NFKC itself produces.
    text = _space_unicode_punctuation(unicodedata.normalize("NFKC", _space_unicode_punctuation(s)))
    return _CJK_TOKEN.findall(normalize_answer(text))


def _space_unicode_punctuation(s: str) -> str:
    return "".join(" " if ch not in _PUNCTUATION and unicodedata.category(ch)[0] == "P" else ch for ch in s)


def extract_answer(text: str | None) -> str | None:
    """Content of the last complete `<answer>...</answer>` block, stripped; None when there is none.

    Tags are case-insensitive and may contain spaces (`< Answer >`, `</ answer>`); the content may
    span lines. "Last block" means: the last closing tag, paired with the nearest opening tag before
    it, so `<answer>draft <answer>final</answer>` gives "final". An opening tag with no closing tag
    after it (a truncated generation) does not count. An empty block gives "" (not None).
    """
    if not text:
        return None
    closes = list(_ANSWER_CLOSE.finditer(text))
    if not closes:
        return None
    close = closes[-1]
    opens = list(_ANSWER_OPEN.finditer(text, 0, close.start()))
    if not opens:
        return None
    return text[opens[-1].end() : close.start()].strip()
