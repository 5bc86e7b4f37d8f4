"""CORD reader: JSON release layout (fixture) and Donut/HF metadata.jsonl layout; error paths."""

import json
from pathlib import Path

import pytest

from pipkie.data.cord import read_cord
from pipkie.data.errors import DataError

FIXTURE = Path(__file__).parent / "fixtures" / "cord"


def test_json_layout_with_gt_parse():
    doc = next(read_cord(FIXTURE, "train"))
    assert doc.id == "receipt_00000" and doc.page_sizes == [(500, 800)]
    assert doc.fields["menu.nm"] == ["ICED LATTE", "CROISSANT"]
    assert doc.fields["menu.price"] == ["56,000", "25,000"]
    assert doc.fields["menu.sub.nm"] == ["EXTRA BUTTER"]
    assert doc.fields["total.total_price"] == ["94,600"]
    assert doc.words[0].text == "ICED" and doc.words[0].box == (80, 125, 320, 162)


def test_json_layout_without_gt_parse():
    doc = list(read_cord(FIXTURE, "train"))[1]
    assert doc.fields == {
        "menu.nm": ["NASI GORENG", "ES TEH"],
        "menu.price": ["30.000", "8.000"],
        "total.total_price": ["38.000"],
    }  # key word TOTAL skipped
    assert "TOTAL" in [w.text for w in doc.words]


def test_metadata_jsonl_layout_and_split_alias(tmp_path):
    gt = {
        "gt_parse": {"menu": {"nm": "KOPI", "price": "9"}, "total": {"total_price": "9"}},
        "meta": {"image_size": {"width": 100, "height": 100}},
        "valid_line": [
            {
                "category": "menu.nm",
                "words": [
                    {
                        "text": "KOPI",
                        "is_key": 0,
                        "quad": {"x1": 1, "y1": 2, "x2": 30, "y2": 2, "x3": 30, "y3": 9, "x4": 1, "y4": 9},
                    }
                ],
            }
        ],
    }
    (tmp_path / "validation").mkdir()
    (tmp_path / "validation" / "metadata.jsonl").write_text(
        json.dumps({"file_name": "r1.png", "ground_truth": json.dumps(gt)}) + "\n"
    )
    (doc,) = read_cord(tmp_path, "dev")
    assert doc.id == "r1" and doc.fields == {"menu.nm": ["KOPI"], "menu.price": ["9"], "total.total_price": ["9"]}
    assert doc.words[0].box == (10, 20, 300, 90)


def test_missing(tmp_path):
    with pytest.raises(DataError, match="no CORD data"):
        list(read_cord(tmp_path, "train"))


def test_malformed_json_file(tmp_path):
    (tmp_path / "train" / "json").mkdir(parents=True)
    (tmp_path / "train" / "json" / "r.json").write_text('{"valid_line": [\n\n  oops]}')
    with pytest.raises(DataError, match=r"r\.json:3: not JSON"):
        list(read_cord(tmp_path, "train"))
    (tmp_path / "train" / "json" / "r.json").write_text(
        '{"valid_line": [{"words": [{"text": "A", "quad": {"x1": 1}}]}]}'
    )
    with pytest.raises(DataError, match=r"r\.json: bad CORD annotation"):
        list(read_cord(tmp_path, "train"))


def test_malformed_metadata_line(tmp_path):
    (tmp_path / "test").mkdir()
    (tmp_path / "test" / "metadata.jsonl").write_text(
        '{"file_name": "a.png", "ground_truth": "{}"}\n{"file_name": "b.png"}\n'
    )
    with pytest.raises(DataError, match=r"metadata\.jsonl:2: .*ground_truth"):
        list(read_cord(tmp_path, "test"))
