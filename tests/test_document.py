"""Reading order and serialize().

The plain grouping (`AS_SCORED`: no stacked-word rule, no deskew), which the readers' gold values
are built with, must not move a word: the quadratic implementation it replaced is kept here as the
reference (`reference_lines`, verbatim apart from names) and both are compared on every SROIE
train/test box file, on WildReceipt dev, and on hypothesis-generated word lists (ties, skew, tall
and flat boxes, several pages, float boxes). serialize() reads the default grouping; what its two
rules change is asserted on pages built for them and, as properties, on generated words.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipkie.io.document import Document, Word, reading_order_lines, serialize
from pipkie.io.reading_order import AS_SCORED, page_shear

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


def lines_serialize(lines: list[list[Word]], layout: bool = False) -> str:
    out = []
    for line in lines:
        text = " ".join(w.text for w in line if w.text.strip())
        if text:
            out.append(f"<{line[0].box[1] // 10},{line[0].box[0] // 10}> {text}" if layout else text)
    return "\n".join(out)


def assert_same(doc: Document) -> None:
    """The plain grouping is the reference's, word for word; serialize() writes the default grouping's
    lines, and that grouping keeps every word once."""
    assert [[id(w) for w in line] for line in reading_order_lines(doc.words, **AS_SCORED)] == [
        [id(w) for w in line] for line in reference_lines(doc.words)
    ], doc.id
    lines = reading_order_lines(doc.words)
    assert sorted(id(w) for line in lines for w in line) == sorted(id(w) for w in doc.words), doc.id
    for layout in (False, True):
        assert serialize(doc, layout=layout).encode() == lines_serialize(lines, layout).encode(), doc.id


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
def test_plain_grouping_is_the_reference_on_real_documents(name, folder, split, count):
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
def test_plain_grouping_is_the_reference_on_generated_words(ws):
    assert_same(Document("generated", ws))


def counting_reads(monkeypatch) -> dict[str, int]:
    """Count the reads of every word's centre and height from now on."""
    reads = {"cy": 0, "height": 0}

    def counted(name):
        plain = getattr(Word, name)

        def get(w):
            reads[name] += 1
            return plain.fget(w)

        return property(get)

    for name in reads:
        monkeypatch.setattr(Word, name, counted(name))
    return reads


def test_one_long_line_is_one_line_in_linear_work(monkeypatch):
    """50,000 words on one line (the old quadratic code re-read the whole line per word and took
    minutes): one line, with a bounded number of reads of each word's height and centre."""
    ws = [Word(f"w{i}", (i % 997, 500 + i % 3, i % 997 + 5, 510 + i % 3)) for i in range(50_000)]
    reads = counting_reads(monkeypatch)
    lines = reading_order_lines(ws, **AS_SCORED)
    assert all(n <= 4 * len(ws) for n in reads.values()), reads  # quadratic code: ~ n^2 / 2
    assert len(lines) == 1 and len(lines[0]) == 50_000
    assert [w.box[0] for w in lines[0]] == sorted(w.box[0] for w in ws)


def tilted_page(slope: float, rows: int = 6, cols: int = 5, height: int = 30, spacing: int = 34) -> list[Word]:
    """`rows` lines of `cols` words, each line rising by `slope` per unit across (0-1000 units), with
    boxes nearly as tall as the line spacing, as rapidocr draws them on a photo."""
    out = []
    for r in range(rows):
        for c in range(cols):
            x0 = 60 + 180 * c
            y = 100 + spacing * r + slope * (x0 + 60 - 500)
            out.append(Word(f"r{r}c{c}", (x0, round(y), x0 + 120, round(y) + height)))
    return out


def texts(lines: list[list[Word]]) -> list[str]:
    return [" ".join(w.text for w in line) for line in lines]


def test_tilted_page_is_read_along_its_tilt():
    ws = tilted_page(0.08)
    assert abs(page_shear(ws) - 0.08) < 0.01
    want = [" ".join(f"r{r}c{c}" for c in range(5)) for r in range(6)]
    assert texts(reading_order_lines(ws)) == want
    assert texts(reading_order_lines(ws, **AS_SCORED)) != want  # lines mixed without the tilt removed


def test_level_and_sparse_pages_are_read_as_level():
    assert page_shear(tilted_page(0.0)) == 0.0
    assert page_shear(tilted_page(0.08, rows=1, cols=3)) == 0.0  # two pairs cannot tell a slope
    assert page_shear(tilted_page(0.01)) == 0.0  # under SHEAR_MIN


def test_stacked_lines_with_tall_boxes_are_not_interleaved():
    """A WildReceipt photo's header as rapidocr boxed it (0-1000): the second line's boxes reach
    into the first's, so the plain grouping read them as one interleaved line."""
    boxes = {
        "Premier": (296, 89, 402, 123), "Restaurants": (415, 92, 575, 130), "Eesti": (590, 97, 665, 133),
        "AS": (677, 100, 704, 134), "Tallinn,": (271, 108, 390, 144), "A.H.": (402, 112, 465, 147),
        "Tammsaare": (475, 114, 604, 152), "tee,": (617, 119, 677, 155), "47": (683, 122, 715, 155),
        "Viru": (398, 136, 460, 169), "restoran": (473, 138, 588, 173),
    }  # fmt: skip
    ws = [Word(t, b) for t, b in boxes.items()]
    assert texts(reading_order_lines(ws, **AS_SCORED))[0].startswith("Tallinn, Premier A.H. Restaurants")
    assert texts(reading_order_lines(ws)) == [
        "Premier Restaurants Eesti AS",
        "Tallinn, A.H. Tammsaare tee, 47",
        "Viru restoran",
    ]
    assert serialize(Document("h", ws)).splitlines()[:2] == [
        "Premier Restaurants Eesti AS",
        "Tallinn, A.H. Tammsaare tee, 47",
    ]


def stacked(a: Word, b: Word) -> bool:
    inter = min(a.box[2], b.box[2]) - max(a.box[0], b.box[0])
    return inter > 0.5 * max(1, min(a.box[2] - a.box[0], b.box[2] - b.box[0]))


@settings(max_examples=EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(words())
def test_no_line_holds_stacked_words(ws):
    for line in reading_order_lines(ws):
        assert len({w.page for w in line}) == 1
        assert not any(stacked(a, b) for i, a in enumerate(line) for b in line[i + 1 :])


def test_large_pages_are_grouped_in_linear_work(monkeypatch):
    """5 pages of 100 lines of 100 words (50,000), each line falling 99 units across the page (nine
    lines' spacing): the default grouping, tilt estimate included, reads each word's centre and
    height a bounded number of times, and finds every line."""
    ws = []
    for r in range(500):
        for c in range(100):
            y = 9 * (r % 100) + c  # slope 0.1 per unit across (x = 10 c)
            ws.append(Word(f"{r}.{c}", (10 * c, y, 10 * c + 8, y + 6), page=r // 100))
    reads = counting_reads(monkeypatch)
    lines = reading_order_lines(ws)
    assert all(n <= 40 * len(ws) for n in reads.values()), reads
    assert texts(lines) == [" ".join(f"{r}.{c}" for c in range(100)) for r in range(500)]


def test_an_engine_line_is_read_whole():
    """A square photo's header as rapidocr read it (0-1000, one engine line per row): the rows bend,
    and boxes reach halfway into the next row, so words alone are grouped wrong; the engine's lines
    placed as units read every row whole and in order."""
    rows = [
        [("FARGA", (209, 38, 278, 78)), ("GRAN", (287, 33, 340, 76)), ("VIA", (353, 31, 393, 71))],
        [("Gran", (204, 58, 264, 102)), ("Via", (276, 58, 313, 100)), ("Corts", (327, 53, 398, 98)),
         ("Catalanes", (404, 49, 533, 96)), ("nº", (547, 47, 576, 91)), ("630", (582, 47, 624, 89))],
        [("08007", (198, 89, 276, 129)), ("Barcelona", (284, 84, 404, 127)), ("/", (416, 82, 431, 122)),
         ("B-61759205", (449, 78, 580, 122))],
        [("Hippopotamus", (200, 111, 362, 153)), ("Restauration", (380, 104, 540, 149)),
         ("S.L.", (551, 102, 611, 142))],
    ]  # fmt: skip
    # the rest of the receipt is level, so the page's slope is 0 and does not straighten the header
    rows += [
        [(f"r{r}c{c}", (150 + 140 * c, 250 + 60 * r, 260 + 140 * c, 290 + 60 * r)) for c in range(5)] for r in range(4)
    ]
    want = [" ".join(t for t, _ in row) for row in rows]
    ws = [Word(t, b, 0, line) for line, row in enumerate(rows) for t, b in row]
    assert page_shear(ws) == 0.0
    assert texts(reading_order_lines(ws)) == want
    unlined = [Word(w.text, w.box) for w in ws]
    assert texts(reading_order_lines(unlined))[:3] == [  # the same words without the engine's lines
        "FARGA GRAN VIA Catalanes nº 630",
        "Gran Via Corts / B-61759205",
        "08007 Barcelona Restauration S.L.",
    ]
    assert texts(reading_order_lines(ws, **AS_SCORED)) == texts(reading_order_lines(unlined, **AS_SCORED))


def test_engine_lines_round_trip_and_stay_apart_per_page(tmp_path):
    from pipkie.io.loaders import load_document
    from pipkie.io.ocr import OCRWord, to_words

    doc = Document("d", words=[Word("a", (1, 2, 3, 4), 0, 7), Word("b", (5, 6, 7, 8))], page_sizes=[(10, 10)])
    d = doc.to_dict()
    assert d["words"][0]["line"] == 7 and "line" not in d["words"][1]  # written only when known
    assert Document.from_dict(d).words == doc.words
    path = tmp_path / "w.json"
    path.write_text(json.dumps(d))
    assert [w.line for w in load_document(path).words] == [7, -1]
    ocr = [OCRWord("x", (0, 0, 5, 5), 0.9, 3)]
    assert to_words(ocr, (10, 10), 0)[0].line != to_words(ocr, (10, 10), 1)[0].line
