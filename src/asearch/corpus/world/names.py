"""Entity names for the synthetic world: short syllable "roots", partitioned by seed so worlds never share a name.

Every name contains exactly one root (`Velmo`, `Orvan University`, `Tavi Velmo`). The root space is
cut into `NAME_PARTITIONS` disjoint parts by a fixed permutation; a world owns the part `seed %
NAME_PARTITIONS`, so two worlds whose seeds differ modulo `NAME_PARTITIONS` cannot share a name.
"""

from __future__ import annotations

import random
import re
from functools import cache

# --------------------------------------------------------------------------- the root space
# A root is onset + vowel + middle + vowel + coda, e.g. "" + "o" + "rv" + "a" + "n" = "Orvan".
# Every middle is consonants and every vowel is vowels, so a root string decodes to one index only
# (tested exhaustively): names from different indices never coincide.
ONSETS = (
    "", "b", "br", "d", "dr", "f", "g", "gr", "h", "j", "k", "kr",
    "l", "m", "n", "p", "r", "s", "sh", "st", "t", "th", "tr", "v", "z",
)  # fmt: skip
VOWELS_1 = ("a", "e", "i", "o", "u", "ai")
MIDDLES = (
    "b", "d", "g", "k", "l", "m", "n", "r", "s", "t", "v", "z", "ld", "lm", "lv",
    "nd", "nt", "rd", "rk", "rn", "rv", "sk", "st", "th", "sh", "ll", "nn", "rr", "lt", "mb",
)  # fmt: skip
VOWELS_2 = ("a", "e", "i", "o", "u", "y")
CODAS = ("", "n", "r", "l", "s", "th", "k", "m", "nd", "rn")

ROOT_SPACE = len(ONSETS) * len(VOWELS_1) * len(MIDDLES) * len(VOWELS_2) * len(CODAS)  # 270,000

NAME_PARTITIONS = 256
"""Seeds that differ modulo this number own disjoint roots, hence disjoint entity names (~1,055 roots each)."""

_PERMUTATION_KEY = 0x5EED_A5EA_2C40_0001  # fixed forever: changing it renames every world


def root_string(index: int) -> str:
    """Decode a root index (mixed radix over the inventories) into its capitalised string."""
    if not 0 <= index < ROOT_SPACE:
        raise ValueError(f"root index must be in [0, {ROOT_SPACE}), got {index}")
    index, coda = divmod(index, len(CODAS))
    index, vowel_2 = divmod(index, len(VOWELS_2))
    index, middle = divmod(index, len(MIDDLES))
    onset, vowel_1 = divmod(index, len(VOWELS_1))
    text = ONSETS[onset] + VOWELS_1[vowel_1] + MIDDLES[middle] + VOWELS_2[vowel_2] + CODAS[coda]
    return text[0].upper() + text[1:]


def root_index(text: str) -> int | None:
    """The index whose root is `text` (case-insensitive), or None when `text` is not a root; inverse of root_string."""
    m = _ROOT_PATTERN.fullmatch(text.lower())
    if m is None:
        return None
    parts = m.groups()
    inventories = (ONSETS, VOWELS_1, MIDDLES, VOWELS_2, CODAS)
    if any(part not in inventory for part, inventory in zip(parts, inventories, strict=True)):
        return None
    index = 0
    for part, inventory in zip(parts, inventories, strict=True):
        index = index * len(inventory) + inventory.index(part)
    return index


# onset = leading consonants, first vowel = a vowel run, middle = consonants, one vowel, coda = the
# rest: each piece is fixed by the letters alone, which is why a root string has only one index.
_ROOT_PATTERN = re.compile(r"([^aeiouy]*)([aeiou]+)([^aeiouy]+)([aeiouy])([^aeiouy]*)")


# --------------------------------------------------------------------------- a keyed permutation of [0, n)
def _mix64(x: int) -> int:
    """splitmix64 finaliser: a cheap, well-spread 64-bit hash used as the Feistel round function."""
    x = (x + 0x9E3779B97F4A7C15) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & 0xFFFFFFFFFFFFFFFF
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & 0xFFFFFFFFFFFFFFFF
    return x ^ (x >> 31)


def permute(index: int, size: int, key: int = _PERMUTATION_KEY, rounds: int = 4) -> int:
    """A fixed bijection of [0, size): a balanced Feistel network on the next even power of two, cycle-walked.

    Cycle walking (re-applying the network until the value falls back inside [0, size)) keeps it a
    bijection on [0, size) itself, so disjoint index sets map to disjoint root sets.
    """
    if not 0 <= index < size:
        raise ValueError(f"index must be in [0, {size}), got {index}")
    half_bits = max(1, ((size - 1).bit_length() + 1) // 2)
    mask = (1 << half_bits) - 1
    value = index
    while True:
        left, right = value >> half_bits, value & mask
        for r in range(rounds):
            left, right = right, left ^ (_mix64(key ^ (r << 56) ^ right) & mask)
        value = (left << half_bits) | right
        if value < size:
            return value


def partition_of(seed: int) -> int:
    """The root partition a world with this seed owns."""
    return seed % NAME_PARTITIONS


def owned_roots(seed: int) -> list[str]:
    """The roots this seed's world may use, in a fixed (seed-independent) order; ~1,055 of them."""
    part = partition_of(seed)
    return [root_string(permute(i, ROOT_SPACE)) for i in range(part, ROOT_SPACE, NAME_PARTITIONS)]


# --------------------------------------------------------------------------- given names (shared by all seeds)
# Given names are not seed-owned: a person's name is "Given Root" and the root alone makes it unique
# to its world. They are built from simpler syllables so they read as first names (Tavi, Doran).
_GIVEN_ONSETS = ("b", "d", "f", "g", "h", "j", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "")
_GIVEN_VOWELS = ("a", "e", "i", "o", "u")
_GIVEN_MIDDLES = ("b", "d", "l", "m", "n", "r", "s", "t", "v", "nn", "ll", "r")
_FEMALE_ENDINGS = ("a", "i", "e", "ia", "ra", "na", "lie", "ne")
_MALE_ENDINGS = ("o", "an", "en", "ir", "ek", "as", "or", "im")
GIVEN_NAMES_PER_GENDER = 200


@cache
def given_names(gender: str) -> tuple[str, ...]:
    """200 first names for "female" or "male"; a constant of the generator, the same for every seed."""
    if gender not in ("female", "male"):
        raise ValueError(f"gender must be 'female' or 'male', got {gender!r}")
    rng = random.Random(f"asearch-world-given-names-{gender}")  # fixed stream: names are constants
    endings = _FEMALE_ENDINGS if gender == "female" else _MALE_ENDINGS
    other = set(given_names("female")) if gender == "male" else set()
    names: list[str] = []
    seen: set[str] = set()
    while len(names) < GIVEN_NAMES_PER_GENDER:
        name = (
            rng.choice(_GIVEN_ONSETS)
            + rng.choice(_GIVEN_VOWELS)
            + rng.choice(_GIVEN_MIDDLES)
            + rng.choice(endings)
        )
        name = name[0].upper() + name[1:]
        if name not in seen and name not in other and len(name) <= 6:
            seen.add(name)
            names.append(name)
    return tuple(names)


# --------------------------------------------------------------------------- name forms per entity type
# "{r}" is the root. Fixed words are English and can never be roots (roots have a vowel-consonant-
# vowel core like "Orva"); a test checks it.
COMPANY_FORMS: dict[str, tuple[str, ...]] = {
    "publishing": ("{r} Press", "{r} Books", "{r} House"),
    "film": ("{r} Pictures", "{r} Studios", "{r} Films"),
    "music": ("{r} Records", "{r} Music", "{r} Sound"),
    "other": ("{r} Group", "{r} Works", "{r} Industries", "{r} Holdings", "{r} Company", "{r} Partners"),
}
UNIVERSITY_FORMS = ("{r} University", "University of {r}", "{r} College", "{r} Institute")
WORK_FORMS: dict[str, tuple[str, ...]] = {
    "book": (
        "The {r} Letters",
        "Songs of {r}",
        "The House of {r}",
        "{r} Road",
        "The Last {r}",
        "A Winter in {r}",
    ),
    "film": ("Back to {r}", "{r} Nights", "The {r} Affair", "Night in {r}", "{r} Rising", "The {r} Run"),
    "album": ("{r} Blue", "Goodbye {r}", "{r} Days", "Electric {r}", "{r} Lights", "Dreams of {r}"),
}
EVENT_KINDS: dict[str, str] = {
    # name word -> what the event is (used in page text: "The Velmo Open was a chess tournament ...")
    "Open": "chess tournament",
    "Marathon": "marathon",
    "Prize": "poetry prize",
    "Derby": "horse race",
    "Regatta": "sailing regatta",
    "Classic": "cycling race",
    "Trophy": "golf tournament",
    "Cup": "tennis tournament",
}


def form_words() -> set[str]:
    """Every fixed word the name forms add around a root (for the no-root-collision check)."""
    forms = [*UNIVERSITY_FORMS, *(f for fs in COMPANY_FORMS.values() for f in fs)]
    forms += [f for fs in WORK_FORMS.values() for f in fs]
    forms += [f"{{r}} {k}" for k in EVENT_KINDS]
    return {w for f in forms for w in f.split() if w != "{r}"}
