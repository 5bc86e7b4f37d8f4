"""Document serialization order and JSONL round trip."""

import random

import pytest

from pipkie.io.document import Document, Word, load_jsonl, reading_order_lines, save_jsonl, serialize


def skewed_receipt() -> Document:
    """Three visual lines on a page tilted so that each line drifts down by 3 units per word."""
    rows = [["STORE", "NAME", "SDN", "BHD"], ["TOTAL", "RM", "12.50"], ["THANK", "YOU"]]
    words = []
    for r, row in enumerate(rows):
        for c, text in enumerate(row):
            y = 100 + 40 * r + 3 * c  # skew: later words sit lower
            words.append(Word(text, (50 + 120 * c, y, 150 + 120 * c, y + 20)))
    random.Random(0).shuffle(words)
    return Document(id="skewed", words=words, page_sizes=[(1000, 1000)], fields={"total": ["12.50"]})


def test_serialize_reading_order_on_skewed_page():
    assert serialize(skewed_receipt()) == "STORE NAME SDN BHD\nTOTAL RM 12.50\nTHANK YOU"


def test_serialize_layout_hint_and_text_override():
    doc = skewed_receipt()
    first = serialize(doc, layout=True).splitlines()[0]
    assert first.startswith("<10,5> STORE")
    assert serialize(Document(id="t", text="plain text")) == "plain text"
    assert [len(line) for line in reading_order_lines(doc.words)] == [4, 3, 2]


def test_jsonl_round_trip(tmp_path):
    docs = [
        skewed_receipt(),
        Document(id="k", text="long contract\nsecond line", fields={"party": ["A Inc.", "B LLC"]}),
        Document(id="p", words=[Word("x", (1, 2, 3, 4), page=1)], page_sizes=[(10, 10), (20, 20)], images=["a.png"]),
    ]
    path = tmp_path / "docs.jsonl"
    assert save_jsonl(docs, path) == 3
    back = list(load_jsonl(path))
    assert back == docs
    assert back[1].value("party") == "A Inc. | B LLC"


def test_jsonl_malformed_line_names_file_and_line(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a"}\n{not json\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        list(load_jsonl(path))
