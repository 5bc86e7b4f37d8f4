"""Donut metadata.jsonl: flattening, import, export and round trip."""

import json
from pathlib import Path

import pytest
from PIL import Image

from pipkie.data.cord import read_cord
from pipkie.data.donut import flatten, read_donut, unflatten, write_donut
from pipkie.data.errors import DataError
from pipkie.data.synthetic import generate_receipts
from pipkie.io.document import Document, Word

FIXTURES = Path(__file__).parent / "fixtures"


def test_flatten_and_unflatten():
    parse = {
        "menu": [{"nm": "A", "price": "1", "sub": [{"nm": "x"}, {"nm": "y"}]}, {"nm": "B"}],
        "total": {"total_price": "5"},
        "party": ["P", "Q"],
        "empty": "",
        "none": None,
    }
    fields = flatten(parse)
    assert fields == {
        "menu.nm": ["A", "B"],
        "menu.price": ["1"],
        "menu.sub.nm": ["x", "y"],
        "total.total_price": ["5"],
        "party": ["P", "Q"],
    }
    assert flatten(unflatten(fields)) == fields
    assert unflatten({"company": ["X"], "party": ["P", "Q"]}) == {"company": "X", "party": ["P", "Q"]}
    with pytest.raises(ValueError, match="both a value and a prefix"):
        unflatten({"a": ["1"], "a.b": ["2"]})


def test_round_trip(tmp_path):
    docs = list(read_cord(FIXTURES / "cord", "train"))
    docs += list(generate_receipts(2, seed=3, out_dir=tmp_path / "img"))
    docs.append(Document(id="contract/7", fields={"party": ["A Inc.", "B LLC"], "term": ["3 years"]}))
    out = tmp_path / "donut" / "train"
    assert write_donut(docs, out) == len(docs)
    back = list(read_donut(tmp_path / "donut", "train"))
    assert [d.id for d in back] == [d.id for d in docs[:-1]] + ["contract_7"]
    for d, b in zip(docs, back):
        assert b.fields == d.fields
        assert [(w.text, w.box) for w in b.words] == [(w.text, w.box) for w in d.words]
        assert b.page_sizes == (d.page_sizes or [(1000, 1000)])
    synth = back[2]
    assert synth.images and Path(synth.images[0]).parent == out
    with Image.open(synth.images[0]) as im:
        assert im.size == synth.page_sizes[0]
    rec = json.loads((out / "metadata.jsonl").read_text().splitlines()[0])
    gt_parse = json.loads(rec["ground_truth"])["gt_parse"]
    assert gt_parse["menu"][1] == {"nm": "CROISSANT", "cnt": "1", "price": "25,000"}
    # Flat fields do not say which item a sub-item belonged to: it goes to the first (documented).
    assert gt_parse["menu"][0]["sub"] == {"nm": "EXTRA BUTTER", "price": "5,000"}
    assert gt_parse["total"]["total_price"] == "94,600"


def test_ground_truth_as_object_and_root_metadata(tmp_path):
    rec = {"file_name": "x.jpg", "ground_truth": {"gt_parses": [{"question": "q1", "answer": "a1"}, {"answer": "a2"}]}}
    (tmp_path / "metadata.jsonl").write_text(json.dumps(rec) + "\n")
    (doc,) = read_donut(tmp_path, "train")
    assert doc.id == "x" and doc.fields == {"question": ["q1"], "answer": ["a1", "a2"]} and not doc.words


def test_errors(tmp_path):
    with pytest.raises(DataError, match="metadata.jsonl"):
        list(read_donut(tmp_path, "train"))
    (tmp_path / "metadata.jsonl").write_text(
        '{"file_name": "a.png", "ground_truth": "{\\"gt_parse\\": {}}"}\n'
        '{"file_name": "b.png", "ground_truth": "{not json"}\n'
    )
    with pytest.raises(DataError, match=r"metadata\.jsonl:2: not JSON"):
        list(read_donut(tmp_path, "train"))
    (tmp_path / "metadata.jsonl").write_text('{"ground_truth": "{}"}\n')
    with pytest.raises(DataError, match=r"metadata\.jsonl:1: .*file_name"):
        list(read_donut(tmp_path, "train"))
    with pytest.raises(ValueError, match="prefix"):
        write_donut([Document(id="a", words=[Word("x")], fields={"a": ["1"], "a.b": ["2"]})], tmp_path / "out")
