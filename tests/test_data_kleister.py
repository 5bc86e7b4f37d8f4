"""Kleister-NDA reader on the shared data, its escaping, and its error paths."""

import lzma
from pathlib import Path

import pytest

from pipkie.data.errors import DataError
from pipkie.data.kleister import parse_expected, read_kleister_nda, unescape

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
NDA = SHARED / "kleister_nda"
needs_nda = pytest.mark.skipif(not NDA.is_dir(), reason=f"Kleister-NDA not found at {NDA}")
HEADER = "filename\tkeys\ttext_djvu\ttext_tesseract\ttext_textract\ttext_best\n"


@needs_nda
@pytest.mark.parametrize("split,count", [("train", 254), ("dev-0", 83)])
def test_real_splits(split, count):
    docs = list(read_kleister_nda(NDA, split))
    assert len(docs) == count
    assert all(d.text and not d.words for d in docs)
    assert all("\\n" not in d.text[:2000] and "\n" in d.text for d in docs)
    assert all(set(d.fields) <= {"party", "jurisdiction", "effective_date", "term"} for d in docs)
    assert sum(len(d.fields.get("party", [])) > 1 for d in docs) > count / 2  # multi-valued
    assert not any("_" in v for d in docs for vs in d.fields.values() for v in vs)


@needs_nda
def test_real_first_document():
    doc = next(read_kleister_nda(NDA, "dev-0"))
    assert doc.id == "073f3b9eb0c7088be4ef688f4edfdb6d"
    assert doc.fields["party"] == ["Liquidmetal Technology Inc.", "Visser Precision Cast LLC"]
    assert doc.fields["term"] == ["3 years"]
    assert "MUTUAL NONDISCLOSURE AGREEMENT" in doc.text
    assert len(list(read_kleister_nda(NDA, "dev-0", limit=5))) == 5


def test_unescape_and_expected():
    assert unescape(r"a\nb\tc\fd\\n\x") == "a\nb\tc\nd\\n\\x"
    assert parse_expected("party=Nike_Inc. party=Eric_Dean jurisdiction=Oregon\n") == {
        "party": ["Nike Inc.", "Eric Dean"],
        "jurisdiction": ["Oregon"],
    }


def _dataset(tmp_path, rows, expected=None, header=HEADER):
    (tmp_path / "dev-0").mkdir(parents=True)
    if header is not None:
        (tmp_path / "in-header.tsv").write_text(header)
    with lzma.open(tmp_path / "dev-0" / "in.tsv.xz", "wt", encoding="utf-8") as f:
        f.write("".join(r + "\n" for r in rows))
    if expected is not None:
        (tmp_path / "dev-0" / "expected.tsv").write_text("".join(e + "\n" for e in expected))
    return tmp_path


def test_layer_choice_and_fallback(tmp_path):
    _dataset(
        tmp_path,
        ["a.pdf\tparty\tdjvu\\ntext\ttess\ttextract\tbest", "b.pdf\tparty\tdjvu\ttess\ttextract\t"],
        ["party=A", "party=B"],
    )
    a, b = read_kleister_nda(tmp_path, "dev-0")
    assert (a.id, a.text, b.text) == ("a", "best", "textract")
    assert next(read_kleister_nda(tmp_path, "dev-0", layer="text_djvu")).text == "djvu\ntext"


def test_missing_files(tmp_path):
    with pytest.raises(DataError, match=r"in\.tsv\.xz"):
        list(read_kleister_nda(tmp_path, "dev-0"))
    _dataset(tmp_path, ["a.pdf\tk\t1\t2\t3\t4"], header=None)
    with pytest.raises(DataError, match=r"in-header\.tsv"):
        list(read_kleister_nda(tmp_path, "dev-0"))


def test_malformed_rows(tmp_path):
    _dataset(tmp_path, ["a.pdf\tk\t1\t2\t3\t4", "b.pdf\tk\t1\t2"], ["party=A", "party=B"])
    with pytest.raises(DataError, match=r"in\.tsv\.xz:2: 4 columns"):
        list(read_kleister_nda(tmp_path, "dev-0"))


def test_malformed_expected(tmp_path):
    _dataset(tmp_path, ["a.pdf\tk\t1\t2\t3\t4", "b.pdf\tk\t1\t2\t3\t4"], ["party=A", "party=B oops"])
    with pytest.raises(DataError, match=r"expected\.tsv:2: .*oops"):
        list(read_kleister_nda(tmp_path, "dev-0"))


def test_expected_shorter_or_longer(tmp_path):
    _dataset(tmp_path, ["a.pdf\tk\t1\t2\t3\t4", "b.pdf\tk\t1\t2\t3\t4"], ["party=A"])
    with pytest.raises(DataError, match=r"expected\.tsv:2: ends before"):
        list(read_kleister_nda(tmp_path, "dev-0"))
    (tmp_path / "dev-0" / "expected.tsv").write_text("party=A\nparty=B\nparty=C\n")
    with pytest.raises(DataError, match=r"expected\.tsv:3: has more lines"):
        list(read_kleister_nda(tmp_path, "dev-0"))


def test_corrupt_archive(tmp_path):
    _dataset(tmp_path, ["a.pdf\tk\t1\t2\t3\t4"])
    (tmp_path / "dev-0" / "in.tsv.xz").write_bytes(b"not xz at all")
    with pytest.raises(DataError, match=r"in\.tsv\.xz: cannot decompress"):
        list(read_kleister_nda(tmp_path, "dev-0"))
