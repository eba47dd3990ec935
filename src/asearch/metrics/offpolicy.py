"""The fixed bins of the staleness lab: how far behind the trained policy each token was sampled, and how
its importance ratio w = pi_prox / pi_behav is spread. The trainer counts tokens into them every step
(`asearch.rl.trainer`) and the viewer draws them; both read the bins here, so a metrics row means the
same thing to both. Pure: no torch.

Keys of a metrics row (token counts, every bin present):

    staleness/versions_behind_hist/<0|1|2|3|4+>   generated tokens by policy version - token version
    is/ratio_hist/<label of RATIO_BINS>            generated tokens by w
    staleness/masked_frac/<0|1|2|3|4+>            share of that bin's tokens the correction masked
"""

from __future__ import annotations

__all__ = [
    "MASKED_FRAC",
    "MASKED_FRAC_BY_STALENESS",
    "RATIO_EDGES",
    "RATIO_HIST",
    "RATIO_LABELS",
    "VERSIONS_BEHIND_HIST",
    "VERSIONS_BEHIND_LABELS",
    "ratio_bin",
    "versions_behind_bin",
]

VERSIONS_BEHIND_HIST = "staleness/versions_behind_hist/"
MASKED_FRAC_BY_STALENESS = "staleness/masked_frac/"
RATIO_HIST = "is/ratio_hist/"
MASKED_FRAC = "is/masked_frac"  # masked tokens / generated tokens, over the whole step

# 0, 1, 2, 3 versions behind, then everything older: eta is 2-8 in practice, the tail is what matters.
VERSIONS_BEHIND_LABELS: tuple[str, ...] = ("0", "1", "2", "3", "4+")

# Log-spaced (the 1-2-5 series) and symmetric under w -> 1/w, with edges at the default bands (0.5, 2, 5)
# so the bins show what each correction drops; the middle bin is "on-policy within 25%".
RATIO_EDGES: tuple[float, ...] = (0.1, 0.2, 0.5, 0.8, 1.25, 2.0, 5.0, 10.0)
RATIO_LABELS: tuple[str, ...] = (
    "<0.1", "0.1-0.2", "0.2-0.5", "0.5-0.8", "0.8-1.25", "1.25-2", "2-5", "5-10", ">=10",
)  # fmt: skip


def versions_behind_bin(behind: int) -> int:
    """The index into VERSIONS_BEHIND_LABELS of a token `behind` versions old (negative counts as 0)."""
    return min(max(behind, 0), len(VERSIONS_BEHIND_LABELS) - 1)


def ratio_bin(w: float) -> int:
    """The index into RATIO_LABELS of ratio `w`: bin i holds RATIO_EDGES[i-1] <= w < RATIO_EDGES[i]."""
    return sum(w >= edge for edge in RATIO_EDGES)
