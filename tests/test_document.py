"""Reading order and serialize(): the O(n log n) implementation gives byte-identical text.

serialize() is the model's input (training, evaluation, extraction), so the running-statistics
reading order must not move a single character. The implementation it replaced is kept here as
the reference (`reference_lines`, verbatim apart from names) and both are compared on every SROIE
train/test box file, on WildReceipt dev, and on hypothesis-generated word lists (ties, skew, tall
and flat boxes, several pages, float boxes).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipkie.io.document import Document, Word, reading_order_lines, serialize

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
EXAMPLES = int(os.environ.get("PIPKIE_FUZZ_EXAMPLES", "150"))


def reference_lines(words: list[Word], overlap: float = 0.5) -> list[list[Word]]:
    """The quadratic reading order serialize() used before running statistics (the reference)."""
    lines: list[list[Word]] = []
    for page in sorted({w.page for w in words}):
        pending = sorted((w for w in words if w.page == page), key=lambda w: (w.cy, w.box[0]))
        page_lines: list[list[Word]] = []
        centres: list[float] = []
        for w in pending:
            if page_lines:
                line = page_lines[-1]
                h = sorted(x.height for x in line)[len(line) // 2]
                if abs(w.cy - centres[-1]) <= overlap * max(h, w.height):
                    line.append(w)
                    centres[-1] = sum(x.cy for x in line) / len(line)
                    continue
            page_lines.append([w])
            centres.append(w.cy)
        lines.extend(sorted(line, key=lambda w: w.box[0]) for line in page_lines)
    return lines


def reference_serialize(doc: Document, layout: bool = False) -> str:
    out = []
    for line in reference_lines(doc.words):
        text = " ".join(w.text for w in line if w.text.strip())
        if text:
            out.append(f"<{line[0].box[1] // 10},{line[0].box[0] // 10}> {text}" if layout else text)
    return "\n".join(out)


def assert_same(doc: Document) -> None:
    assert [[id(w) for w in line] for line in reading_order_lines(doc.words)] == [
        [id(w) for w in line] for line in reference_lines(doc.words)
    ], doc.id
    for layout in (False, True):
        assert serialize(doc, layout=layout).encode() == reference_serialize(doc, layout).encode(), doc.id


def dataset(name: str, folder: str, split: str) -> list[Document]:
    from pipkie.data import read_dataset

    if not (SHARED / folder).is_dir():
        pytest.skip(f"{SHARED / folder} not present")
    docs = list(read_dataset(name, SHARED / folder, split))
    assert docs and all(d.words for d in docs)
    return docs


@pytest.mark.parametrize(
    "name, folder, split, count",
    [("sroie", "sroie", "train", 626), ("sroie", "sroie", "test", 347), ("wildreceipt", "wildreceipt_dev", "dev", 100)],
)
def test_serialize_is_byte_identical_on_real_documents(name, folder, split, count):
    docs = dataset(name, folder, split)
    assert len(docs) == count
    for doc in docs:
        assert_same(doc)


coord = st.one_of(st.integers(0, 1000), st.floats(0, 1000, allow_nan=False, width=32))


@st.composite
def words(draw):
    """Word lists built to stress the line grouping: shared rows with jitter, ties, tall boxes, pages."""
    rows = draw(st.lists(st.integers(0, 1000), min_size=1, max_size=8))
    out = []
    for i in range(draw(st.integers(0, 60))):
        if draw(st.booleans()):  # on one of a few rows, with jitter and varied heights
            y = draw(st.sampled_from(rows)) + draw(st.integers(-6, 6))
            h = draw(st.sampled_from([1, 2, 8, 10, 12, 30, 200]))
            x = draw(st.integers(0, 990))
            box = (x, max(0, y), x + draw(st.integers(0, 50)), min(1000, max(0, y) + h))
        else:
            a, b, c, d = draw(coord), draw(coord), draw(coord), draw(coord)
            box = (min(a, c), min(b, d), max(a, c), max(b, d))
        text = draw(st.sampled_from(["", " ", "TOTAL", "9.90", "Ünïcode", "a b"])) + str(i)
        out.append(Word(text, box, draw(st.integers(0, 2))))
    return out


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(words())
def test_serialize_is_byte_identical_on_generated_words(ws):
    assert_same(Document("generated", ws))


def test_one_long_line_is_one_line_in_linear_work(monkeypatch):
    """50,000 words on one line (the old quadratic code re-read the whole line per word and took
    minutes): one line, with a bounded number of reads of each word's height and centre."""
    ws = [Word(f"w{i}", (i % 997, 500 + i % 3, i % 997 + 5, 510 + i % 3)) for i in range(50_000)]
    reads = {"cy": 0, "height": 0}

    def counted(name):
        plain = getattr(Word, name)

        def get(w):
            reads[name] += 1
            return plain.fget(w)

        return property(get)

    for name in reads:
        monkeypatch.setattr(Word, name, counted(name))
    lines = reading_order_lines(ws)
    assert all(n <= 4 * len(ws) for n in reads.values()), reads  # quadratic code: ~ n^2 / 2
    assert len(lines) == 1 and len(lines[0]) == 50_000
    assert [w.box[0] for w in lines[0]] == sorted(w.box[0] for w in ws)
