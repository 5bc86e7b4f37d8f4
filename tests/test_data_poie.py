"""POIE reader on the hand-made fixture, IOB span decoding, and error paths."""

import json
from pathlib import Path

import pytest

from pipkie.data.errors import DataError
from pipkie.data.poie import read_poie, spans

FIXTURE = Path(__file__).parent / "fixtures" / "poie"


def test_fixture_labels():
    a, b = read_poie(FIXTURE, "test")
    assert a.id == "images_label_0001" and a.page_sizes == [(800, 1000)]
    assert a.fields == {"SERVING SIZE": ["30g"], "ENERGY/100G": ["2000kJ"], "ENERGY/PER": ["600kJ"]}
    assert "###" not in [w.text for w in a.words] and len(a.words) == 5
    assert b.fields == {"PROTEIN/100G": ["12.5g"], "SODIUM/100G": ["350 mg"]}  # from the IOB tags
    assert len(list(read_poie(FIXTURE, "test", limit=1))) == 1


def test_spans():
    tags = ["O", "B-A", "I-A", "O", "B-B", "B-B", "I-C"]
    assert spans("xabcdef", tags) == [("A", "ab"), ("B", "d"), ("B", "e"), ("C", "f")]
    with pytest.raises(ValueError, match="tags"):
        spans("abc", ["O"])


def test_missing(tmp_path):
    with pytest.raises(DataError, match=r"train\.txt"):
        list(read_poie(tmp_path, "train"))


def _line(**changes):
    rec = {
        "file_name": "a.jpg",
        "height": 10,
        "width": 10,
        "annotations": [{"polygon": [0, 0, 5, 0, 5, 5, 0, 5], "text": "ab", "entity": ["B-X", "I-X"]}],
    }
    rec["annotations"][0].update(changes)
    return json.dumps(rec)


@pytest.mark.parametrize(
    "bad,why",
    [
        ("{oops", "not JSON"),
        (_line(entity=["B-X"]), "1 entity tags"),
        (_line(entity=["B-Y", "I-Y"]), "class_list"),
        (_line(polygon=[1, 2, 3]), "polygon"),
    ],
)
def test_malformed_line(tmp_path, bad, why):
    (tmp_path / "class_list.json").write_text('["X"]')
    (tmp_path / "train.txt").write_text(_line() + "\n" + bad + "\n")
    with pytest.raises(DataError, match=rf"train\.txt:2: .*{why}"):
        list(read_poie(tmp_path, "train"))


def test_malformed_class_list(tmp_path):
    (tmp_path / "class_list.json").write_text('{"X": 1}')
    (tmp_path / "train.txt").write_text(_line() + "\n")
    with pytest.raises(DataError, match=r"class_list\.json"):
        list(read_poie(tmp_path, "train"))
