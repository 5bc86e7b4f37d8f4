"""WildReceipt (mmocr KIE format) reader on the shared sample, and its error paths."""

import json
from pathlib import Path

import pytest

from pipkie.data.errors import DataError
from pipkie.data.wildreceipt import SROIE_KEYS, read_class_list, read_wildreceipt

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
WILD = SHARED / "wildreceipt_sample"
needs_wild = pytest.mark.skipif(not WILD.is_dir(), reason=f"WildReceipt sample not found at {WILD}")


@needs_wild
def test_sample_all_value_classes():
    docs = list(read_wildreceipt(WILD, "test"))
    assert len(docs) == 5
    first = docs[0]
    assert first.id == "Image_32_15_2064" and first.page_sizes == [(747, 1000)]
    assert first.images and Path(first.images[0]).is_file()
    assert first.fields["store_name"] == ["CeeFineThaiDining"]
    assert first.fields["date"] == ["Jan08,2014"]  # printed twice, kept once
    assert first.fields["total"] == ["19.69"]
    assert not any(k.endswith("_key") or k in ("ignore", "others") for d in docs for k in d.fields)
    la_banca = docs[1]
    assert len(la_banca.fields["prod_item"]) == len(la_banca.fields["prod_price"]) == 9  # one per line
    assert la_banca.fields["prod_item"][0] == "OliveMarinateConPane"


@needs_wild
def test_sample_sroie_keys():
    docs = list(read_wildreceipt(WILD, "test", keys="sroie"))
    assert all(set(d.fields) <= set(SROIE_KEYS.values()) for d in docs)
    assert docs[0].fields == {
        "company": ["CeeFineThaiDining"],
        "address": ["9901FairfaxBlvd. Fairfax,VA22030"],
        "date": ["Jan08,2014"],
        "total": ["19.69"],
    }
    assert len(list(read_wildreceipt(WILD, "test", limit=2))) == 2
    with pytest.raises(ValueError, match="keys"):
        list(read_wildreceipt(WILD, keys="everything"))


def _write(tmp_path, lines, classes="Ignore\nStore_name_value\nStore_name_key\nTotal_value\n"):
    (tmp_path / "class_list.txt").write_text(classes)
    (tmp_path / "test.txt").write_text("".join(line + "\n" for line in lines))
    return tmp_path


def _record(label=1, box=(10, 10, 90, 10, 90, 30, 10, 30)):
    return json.dumps(
        {
            "file_name": "image_files/a/1.jpg",
            "height": 100,
            "width": 100,
            "annotations": [{"box": list(box), "text": "SHOP", "label": label}],
        }
    )


def test_class_list_with_ids(tmp_path):
    (tmp_path / "class_list.txt").write_text("0 Ignore\n1 Store_name_value\n5 Total_value\n")
    assert read_class_list(tmp_path / "class_list.txt") == {0: "Ignore", 1: "Store_name_value", 5: "Total_value"}
    (tmp_path / "test.txt").write_text(_record(label=5) + "\n")
    doc = next(read_wildreceipt(tmp_path))
    assert doc.id == "a_1" and doc.fields == {"total": ["SHOP"]} and doc.words[0].box == (100, 100, 900, 300)


def test_missing_files(tmp_path):
    with pytest.raises(DataError, match=r"test\.txt"):
        list(read_wildreceipt(tmp_path / "nowhere"))
    (tmp_path / "test.txt").write_text(_record() + "\n")
    with pytest.raises(DataError, match=r"class_list\.txt"):
        list(read_wildreceipt(tmp_path))


@pytest.mark.parametrize(
    "bad,why",
    [
        ("{not json", "not JSON"),
        (_record(label=9), "label 9"),
        (_record(box=(1, 2, 3)), "box"),
        ('{"file_name": "x.jpg", "height": 10, "width": 10}', "annotations"),
    ],
)
def test_malformed_line(tmp_path, bad, why):
    _write(tmp_path, [_record(), bad])
    with pytest.raises(DataError, match=rf"test\.txt:2: .*{why}"):
        list(read_wildreceipt(tmp_path))
