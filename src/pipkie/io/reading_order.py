"""Reading order: a page's words grouped into visual lines, top to bottom, left to right.

`reading_order_lines(words)` is what `serialize` (and so training, evaluation and extraction) reads.
Words are taken in order of their vertical centre; a word joins a line when its centre lies within
`overlap` x the line's median word height of the line's running centre (a running centre tolerates
the slow drift of a skewed scan). Three rules make it hold on photographed receipts, where OCR
boxes are tall (an axis-aligned box around a tilted word, plus the detector's padding) and lines close:

- stacked words never share a line (`stacked`): two words whose x-ranges overlap by more than half
  the narrower one are one above the other, so a word that would join a line holding such a word
  joins the nearest other line within reach, or starts one. Without it, `Premier Restaurants Eesti
  AS` and the address line under it were read as one interleaved line;
- a tilted page is read along its tilt (`deskew`): the page's slope is the median slope between
  neighbouring words (`page_shear`), and centres are compared after removing it (a shear: boxes are
  0-1000 on each axis, so the slope is in those units, whatever the image's aspect ratio);
- an OCR engine's text line stays whole (`engine_lines`): words the engine read in one line
  (`Word.line`, kept by `pipkie ocr` and the loaders) are placed as one unit, so a curved or
  locally tilted photo, where one page slope does not hold, still reads its lines whole.

Measured on WildReceipt dev (docs/RESULTS.md "Reading order of photographed receipts"). The
datasets' readers group a key's gold boxes with the three rules off (`AS_SCORED`), so gold values
stay what every published number was scored against. Work is O(n log n) in the number of words.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pipkie.io.document import Word

STACKED = 0.5  # x-ranges overlapping by more than this share of the narrower word: one above the other
LOOKBACK = 4  # a word may join one of the last lines started (only they can be within reach of it)
SHEAR_MIN = 0.02  # a page rising or falling less than this per unit across is read as level
SHEAR_MAX = 0.5  # slopes beyond this are not a tilted receipt: read as level
SHEAR_PAIRS = 5  # fewer neighbouring word pairs than this cannot tell a slope: read as level
# the grouping the readers' gold values are built with (every published number was scored against it)
AS_SCORED = {"stacked": None, "deskew": False, "engine_lines": False}


class _LineStats:
    """Running statistics of the line being built: the upper median of its word heights and the mean
    of its word centres, updated in O(log n) per word (`sorted(heights)[n // 2]` and `sum(centres) / n`
    exactly, summed left to right from 0 as `sum()` does), and its words' x-ranges sorted by left
    edge, to find a stacked word in O(log n) (`stacks`)."""

    __slots__ = ("low", "high", "total", "n", "centre", "spans", "widest")

    def __init__(self, y: float, h: int, x0: int, x1: int):
        self.low: list = []  # max-heap (negated) of the lower floor(n/2) heights
        self.high: list = [h]  # min-heap of the upper ceil(n/2) heights
        self.total = 0 + y
        self.n = 1
        self.centre = y  # a one-word line's centre is its word's (not sum / 1)
        self.spans = [(x0, x1)]
        self.widest = x1 - x0

    @property
    def median_height(self):
        return self.high[0]

    def add(self, y: float, h: int, x0: int, x1: int) -> None:
        if h >= self.high[0]:
            heapq.heappush(self.high, h)
        else:
            heapq.heappush(self.low, -h)
        if len(self.high) > len(self.low) + 1:
            heapq.heappush(self.low, -heapq.heappop(self.high))
        elif len(self.low) > len(self.high):
            heapq.heappush(self.high, -heapq.heappop(self.low))
        self.total += y
        self.n += 1
        self.centre = self.total / self.n
        insort(self.spans, (x0, x1))
        self.widest = max(self.widest, x1 - x0)

    def stacks(self, x0: int, x1: int, share: float) -> bool:
        """Whether a word spanning x0..x1 overlaps one of the line's words by more than `share` of
        the narrower of the two. Only words starting in (x0 - widest, x1) can overlap it."""
        lo = bisect_right(self.spans, (x0 - self.widest, float("inf")))
        hi = bisect_left(self.spans, (x1, float("-inf")))
        for a0, a1 in self.spans[lo:hi]:
            if min(a1, x1) - max(a0, x0) > share * max(1, min(a1 - a0, x1 - x0)):
                return True
        return False


def _unit(words: list[Word], s: float) -> tuple[float, int, int, int, list[Word]]:
    """(centre, x0, x1, height, words) of words grouped as one, read along the page's tilt `s`: a
    tilted word's box is taller than its text by |s| x its width."""
    ys, hs = [], []
    for w in words:
        y, h = w.cy, w.height
        if s:
            y, h = y - s * ((w.box[0] + w.box[2]) / 2 - 500), max(1, int(h - abs(s) * (w.box[2] - w.box[0])))
        ys.append(y)
        hs.append(h)
    y = ys[0] if len(ys) == 1 else sum(ys) / len(ys)
    return y, min(w.box[0] for w in words), max(w.box[2] for w in words), sorted(hs)[len(hs) // 2], words


def page_shear(words: list[Word]) -> float:
    """The page's slope (dy per dx, 0-1000 units) from each word and its nearest right-hand
    neighbour on the same line (centres within 0.6 of the taller height, a gap under 6 heights), the
    median of those slopes; 0 when it is under `SHEAR_MIN`, over `SHEAR_MAX` or from too few pairs.
    Neighbours are looked up in horizontal bands of the median word height: O(n log n)."""
    if len(words) < SHEAR_PAIRS + 1:
        return 0.0
    heights = sorted(w.height for w in words)
    band = max(1, heights[len(heights) // 2])
    bands: dict[int, list] = {}
    for w in words:
        bands.setdefault(int(w.cy // band), []).append((w.box[0], w))
    for row in bands.values():
        row.sort(key=lambda t: t[0])
    slopes = []
    for a in words:
        ax, ay, ah = (a.box[0] + a.box[2]) / 2, a.cy, a.height
        best = None
        for b_ in (int(ay // band) - 1, int(ay // band), int(ay // band) + 1):
            row = bands.get(b_, ())
            i = bisect_left(row, a.box[2] - 0.2 * (a.box[2] - a.box[0]), key=lambda t: t[0])
            for x0, b in row[i : i + 3]:  # the first few words starting right of a
                gap = x0 - a.box[2]
                if b is a or gap > 6 * max(ah, b.height) or abs(b.cy - ay) > 0.6 * max(ah, b.height):
                    continue
                if best is None or gap < best[0]:
                    best = (gap, b)
        if best is not None:
            b = best[1]
            dx = (b.box[0] + b.box[2]) / 2 - ax
            if dx > 0:
                slopes.append((b.cy - ay) / dx)
    if len(slopes) < SHEAR_PAIRS:
        return 0.0
    slopes.sort()
    s = slopes[len(slopes) // 2]
    return s if SHEAR_MIN <= abs(s) <= SHEAR_MAX else 0.0


def reading_order_lines(
    words: list[Word],
    overlap: float = 0.5,
    stacked: float | None = STACKED,
    deskew: bool = True,
    engine_lines: bool = True,
) -> list[list[Word]]:
    """Group words into lines and sort them (pages, then top to bottom, then left to right).

    With `engine_lines`, the words of one OCR engine line (`Word.line` >= 0) are one unit: its
    centre the mean of theirs, its height their median, its x-range theirs together, its words in
    their left-to-right order. `stacked=None`, `deskew=False` and `engine_lines=False` (`AS_SCORED`)
    give the plain grouping: each word joins the line started last or starts one. Otherwise a word
    (or unit) joins, of the last `LOOKBACK` lines, the one whose centre is nearest among those within
    reach and without a word it is stacked on. Lines keep the order of their first word; the words
    of a line go left to right.
    """
    by_page: dict[int, list[Word]] = {}
    for w in words:
        by_page.setdefault(w.page, []).append(w)
    lines: list[list[Word]] = []
    for page in sorted(by_page):
        ws = by_page[page]
        s = page_shear(ws) if deskew else 0.0
        keyed, by_line = [], {}
        for w in ws:
            if engine_lines and w.line >= 0:
                by_line.setdefault(w.line, []).append(w)
            else:
                keyed.append(_unit([w], s))
        keyed += [_unit(sorted(u, key=lambda w: w.box[0]), s) for u in by_line.values()]
        keyed.sort(key=lambda t: (t[0], t[1]))
        page_lines: list[list[Word]] = []
        stats: list[_LineStats] = []
        for y, x0, x1, h, unit in keyed:
            best = None
            for j in range(len(stats) - 1, max(-1, len(stats) - 1 - (LOOKBACK if stacked is not None else 1)), -1):
                line = stats[j]
                d = abs(y - line.centre)
                if d > overlap * max(line.median_height, h) or (best is not None and d >= best[0]):
                    continue
                if stacked is not None and line.stacks(x0, x1, stacked):
                    continue
                best = (d, j)
            if best is None:
                page_lines.append([(x0, unit)])
                stats.append(_LineStats(y, h, x0, x1))
            else:
                page_lines[best[1]].append((x0, unit))
                stats[best[1]].add(y, h, x0, x1)
        lines.extend([w for _, unit in sorted(line, key=lambda t: t[0]) for w in unit] for line in page_lines)
    return lines
