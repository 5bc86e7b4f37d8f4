"""SROIE reader: official counts, box parsing, error paths."""

from pathlib import Path

import pytest

from pipkie.data.errors import DataError
from pipkie.data.sroie import KEYS, read_box_file, read_sroie

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
SROIE = SHARED / "sroie"
needs_sroie = pytest.mark.skipif(not SROIE.is_dir(), reason=f"SROIE not found at {SROIE} (shared data absent)")


@needs_sroie
@pytest.mark.parametrize("split,count", [("train", 626), ("test", 347)])
def test_official_counts(split, count):
    docs = list(read_sroie(SROIE, split))
    assert len(docs) == count
    assert len({d.id for d in docs}) == count
    assert all(set(d.fields) <= set(KEYS) and d.words and d.page_sizes for d in docs)
    assert all(0 <= v <= 1000 for d in docs for w in d.words for v in w.box)
    assert sum(len(d.fields) for d in docs) > 3.5 * count  # a key is only rarely missing


@needs_sroie
def test_limit_and_images():
    docs = list(read_sroie(SROIE, "train", limit=3))
    assert len(docs) == 3
    assert any(d.images for d in read_sroie(SROIE, "train"))  # 20 images are shipped


def test_box_line_text_with_commas(tmp_path):
    path = tmp_path / "X1.txt"
    path.write_text("10,20,110,20,110,40,10,40,TOTAL: 1,234.50\n\n0,50,200,50,200,70,0,70,NO. 5, JALAN 1,\n")
    words, size = read_box_file(path, 200, 100)
    assert [w.text for w in words] == ["TOTAL: 1,234.50", "NO. 5, JALAN 1,"]
    assert words[0].box == (50, 200, 550, 400)
    assert size == (200, 100)
    _, size = read_box_file(path)  # page size from the boxes' extent
    assert size == (200, 70)


def test_missing_directory(tmp_path):
    with pytest.raises(DataError, match="box"):
        list(read_sroie(tmp_path, "train"))


@pytest.mark.parametrize("line,why", [("1,2,3,4,5,6,7,TEXT", "8 coordinates"), ("1,2,3,x,5,6,7,8,TEXT", "not numbers")])
def test_malformed_box_line(tmp_path, line, why):
    (tmp_path / "train" / "box").mkdir(parents=True)
    (tmp_path / "train" / "box" / "X1.txt").write_text(f"1,2,3,4,5,6,7,8,OK\n{line}\n")
    with pytest.raises(DataError, match=rf"X1\.txt:2: .*{why}"):
        list(read_sroie(tmp_path, "train"))


def test_malformed_entities_and_meta(tmp_path):
    root = tmp_path / "train"
    (root / "box").mkdir(parents=True)
    (root / "entities").mkdir()
    (root / "box" / "X1.txt").write_text("1,2,3,2,3,4,1,4,A\n")
    (root / "entities" / "X1.txt").write_text('{\n "company": "A",\n oops\n}')
    with pytest.raises(DataError, match=r"entities[/\\]X1\.txt:3"):
        list(read_sroie(tmp_path, "train"))
    (root / "entities" / "X1.txt").write_text('{"company": "A"}')
    (root / "images.jsonl").write_text('{"id": "X1", "width": 10, "height": 10}\n{"id": "X2"}\n')
    with pytest.raises(DataError, match=r"images\.jsonl:2"):
        list(read_sroie(tmp_path, "train"))
