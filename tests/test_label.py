"""Pseudo-labels (`pipkie label`, pipkie.train.label): confident answers become fields, resumably."""

import json
import random

import pytest
from typer.testing import CliRunner

from pipkie.cli import app
from pipkie.data import read_dataset
from pipkie.extract import Extraction, Field
from pipkie.io.document import Document, Word
from pipkie.schema import SchemaError
from pipkie.train.label import MANIFEST, SUMMARY, label_folder, manifest_rows, summed_run
from pipkie.train.mixture import Mixture, templates


class FakeExtractor:
    """Answers from a table {doc id: {key: (value, confidence)}}; counts the documents it is asked."""

    name = "fake"

    def __init__(self, answers):
        self.answers, self.asked = answers, []

    def extract_many(self, docs, schema=None, batch_size=4):
        out = []
        for d in docs:
            self.asked.append(d.id)
            got = self.answers[d.id]
            fields = {k.name: Field(*got.get(k.name, (None, 0.5))) for k in schema.keys}
            for g in schema.groups:  # a list: [{field: (value, confidence)}, ...]
                fields[g.name] = [{n: Field(*v) for n, v in it.items()} for it in got.get(g.name, [])]
            out.append(Extraction(d.id, fields, "pip", 0.0))
        return out


def write_words(folder, ids):
    folder.mkdir(parents=True, exist_ok=True)
    for i in ids:
        doc = Document(i, [Word(w, (10 * n, 0, 10 * n + 9, 9)) for n, w in enumerate(f"SHOP {i} TOTAL 9.99".split())])
        (folder / f"{i}.json").write_text(json.dumps({**doc.to_dict(), "normalized": True}))


def test_only_confident_values_become_fields_and_a_rerun_labels_nothing_twice(tmp_path):
    write_words(tmp_path / "src", ["a", "b", "c"])
    answers = {
        "a": {"company": ("SHOP a", 0.95), "total": ("9.99", 0.5)},
        "b": {"company": ("SHOP b", 0.2), "total": ("9.99", 0.9)},
        "c": {"company": ("SHOP c", 0.3)},  # nothing confident: no document written
    }
    ex = FakeExtractor(answers)
    stats = label_folder(ex, tmp_path / "src", tmp_path / "out", keys="company,total:money", progress=False)
    assert stats == {"documents": 3, "labelled": 2, "values": 5, "kept": {"company": 1, "total": 1}}
    docs = {d.id: d.fields for d in read_dataset("words", tmp_path / "out", "docs")}
    assert docs == {"a": {"company": ["SHOP a"]}, "b": {"total": ["9.99"]}}
    rows = [json.loads(x) for x in (tmp_path / "out" / MANIFEST).read_text().splitlines()]
    assert [r["id"] for r in rows] == ["a", "b", "c"] and rows[0]["answers"]["total"] == ["9.99", 0.5]
    ex.asked.clear()
    again = label_folder(ex, tmp_path / "src", tmp_path / "out", keys="company,total:money", progress=False)
    assert again["documents"] == 0 and ex.asked == []
    assert len(json.loads((tmp_path / "out" / SUMMARY).read_text())["runs"]) == 2


def test_other_keys_add_their_fields_to_the_same_documents_under_their_stored_names(tmp_path):
    write_words(tmp_path / "src", ["a"])
    ex = FakeExtractor({"a": {"company": ("SHOP a", 0.99), "tel": ("555", 0.97)}})
    label_folder(ex, tmp_path / "src", tmp_path / "out", keys="company", store_as={"company": "store_name"})
    label_folder(ex, tmp_path / "src", tmp_path / "out", keys="tel")
    (doc,) = read_dataset("words", tmp_path / "out", "docs")
    assert doc.fields == {"store_name": ["SHOP a"], "tel": ["555"]}
    assert [w.text for w in doc.words] == ["SHOP", "a", "TOTAL", "9.99"]  # the words travel unchanged


def test_a_torn_manifest_line_is_labelled_again(tmp_path):
    write_words(tmp_path / "src", ["a", "b"])
    ex = FakeExtractor({"a": {"company": ("SHOP a", 0.99)}, "b": {"company": ("SHOP b", 0.99)}})
    label_folder(ex, tmp_path / "src", tmp_path / "out", keys="company", progress=False)
    manifest = tmp_path / "out" / MANIFEST
    manifest.write_text(manifest.read_text().splitlines()[0] + "\n" + '{"id": "b", "ke')  # killed mid-line
    ex.asked.clear()
    label_folder(ex, tmp_path / "src", tmp_path / "out", keys="company", progress=False)
    assert ex.asked == ["b"]
    ex.asked.clear()
    label_folder(ex, tmp_path / "src", tmp_path / "out", keys="company", progress=False)
    assert ex.asked == []  # the row written after the torn line stands on its own line


def test_shards_label_disjoint_documents_into_their_own_manifests_and_resume_across_them(tmp_path):
    write_words(tmp_path / "src", ["a", "b", "c", "d", "e"])
    ex = FakeExtractor({i: {"total": ("9.99", 0.99)} for i in "abcde"})
    for i in (0, 1):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total", shard=(i, 2), progress=False)
    assert ex.asked == ["a", "c", "e", "b", "d"]
    assert sorted(p.name for p in (tmp_path / "out").glob("labels*")) == ["labels-0of2.jsonl", "labels-1of2.jsonl"]
    assert sorted(r["id"] for r in manifest_rows(tmp_path / "out")) == list("abcde")
    ex.asked.clear()
    assert label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total", progress=False)["documents"] == 0
    with pytest.raises(ValueError, match="shard"):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total", shard=(2, 2))


def test_lists_thresholds_and_renames_of_keys_not_asked_are_refused(tmp_path):
    write_words(tmp_path / "src", ["a"])
    ex = FakeExtractor({"a": {}})
    with pytest.raises(SchemaError, match="give sum_to"):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total,items[name,price]")
    with pytest.raises(SchemaError, match="not asked: subtotal"):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total,items[name,price]", sum_to=("subtotal",))
    with pytest.raises(SchemaError, match="with price among them"):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total,items[name,cost]", sum_to=("total",))
    with pytest.raises(SchemaError, match="ask for one"):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total", sum_to=("total",))
    with pytest.raises(ValueError, match="min_confidence"):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total", min_confidence=0)
    with pytest.raises(ValueError, match="not asked: company"):
        label_folder(ex, tmp_path / "src", tmp_path / "out", keys="total", store_as={"company": "x"})


def test_the_summed_run_is_the_earliest_then_longest_of_two_or_more_prices_adding_up():
    # header line (no price), two items adding up to the subtotal, the SUBTOTAL and TAX lines (which
    # add up to the total too, later), the TOTAL line
    prices = [None, 300, 450, 750, 60, 810]
    assert summed_run(prices, {750, 810}) == (1, 3, 750)
    assert summed_run([750, 300, 450], {750}) == (1, 3, 750)  # one price equal to the total proves nothing
    assert summed_run([100, 200, -50, 250], {250, 300}) == (0, 3, 250)  # a discount line; the longest from 0
    assert summed_run([100, None, 200], {300}) is None  # a line without an amount breaks a run
    assert summed_run([0, 0], {0}) is None and summed_run([], {5}) is None


def test_a_list_is_kept_only_as_the_run_of_items_whose_prices_add_up_to_an_amount_read(tmp_path):
    write_words(tmp_path / "src", ["a", "b"])
    items = [
        {"name": ("STORE 12", 0.4), "price": (None, 0.3)},  # a header line taken for an item
        {"name": ("Coke", 0.8), "price": ("$3.00", 0.6)},
        {"name": ("Bread", 0.7), "price": ("4,50", 0.5)},
        {"name": ("TOTAL", 0.9), "price": ("7.50", 0.9)},
    ]
    answers = {
        "a": {"total": ("$7.50", 0.4), "items": items},  # an unsure total still checks the sum
        "b": {"total": ("9.99", 0.95), "items": items},  # no run adds up to 9.99: the list is dropped
    }
    stats = label_folder(
        FakeExtractor(answers),
        tmp_path / "src",
        tmp_path / "out",
        keys="total:money,items[name,price:money]",
        sum_to=("total",),
        progress=False,
    )
    assert stats["kept"] == {"total": 2, "items": 1} and stats["labelled"] == 2
    docs = {d.id: d for d in read_dataset("words", tmp_path / "out", "docs")}
    # the unsure total is kept: the items add up to it
    assert docs["a"].fields == {"items.name": ["Coke", "Bread"], "items.price": ["$3.00", "4,50"], "total": ["$7.50"]}
    assert docs["b"].fields == {"total": ["9.99"]}
    rows = {r["id"]: r for r in map(json.loads, (tmp_path / "out" / MANIFEST).read_text().splitlines())}
    assert rows["a"]["keys"] == "total,items[name,price]" and rows["a"]["answers"]["items"]["kept"] == [1, 3]
    assert rows["b"]["answers"]["items"]["kept"] is None and len(rows["b"]["answers"]["items"]["items"]) == 4
    mix = Mixture.from_config(
        [{"source": "dataset", "name": "words", "data_dir": str(tmp_path / "out"), "split": "docs", "items": 1.0}]
    )
    doc = docs["a"]
    ((schema, values),) = templates(
        mix.sources[0],
        doc,
        random.Random(0),
        1,
        value_len=len,
        key_dropout=0.3,
        absent=0.5,
        items=1.0,
        item_room=400,
        variation=0.0,
    )
    assert [it["name"] for it in values[schema.groups[0].name]] == ["Coke", "Bread"]


def test_pseudo_labelled_documents_train_as_a_supervised_mixture_source(tmp_path):
    write_words(tmp_path / "src", ["a"])
    label_folder(FakeExtractor({"a": {"total": ("9.99", 0.99)}}), tmp_path / "src", tmp_path / "out", keys="total")
    mix = Mixture.from_config(
        [{"source": "dataset", "name": "words", "data_dir": str(tmp_path / "out"), "split": "docs"}]
    )
    source, doc = mix.draw(random.Random(0))
    assert source.supervised
    asked = templates(source, doc, random.Random(1), 20, value_len=len, key_dropout=0.3, absent=0.5)
    answers = [v for _, values in asked for v in values.values()]
    assert "9.99" in answers and set(answers) <= {"9.99", None}  # its one label, or a key it lacks


def test_pipkie_label_command_labels_with_the_shipped_model_and_says_what_is_wrong(tmp_path):
    write_words(tmp_path / "src", ["r1"])
    run = CliRunner().invoke
    ok = run(
        app,
        ["label", str(tmp_path / "src"), "--out", str(tmp_path / "out"), "--keys", "total", "--min-confidence", "0.01"],
    )
    assert ok.exit_code == 0, ok.output
    stats = json.loads(ok.stdout.strip().splitlines()[-1])
    assert stats["documents"] == 1 and stats["values"] == 1 and stats["kept"] == {"total": 1}
    (doc,) = read_dataset("words", tmp_path / "out", "docs")
    assert doc.fields["total"] == ["9.99"]
    bad = run(
        app, ["label", str(tmp_path / "src"), "--out", str(tmp_path / "o2"), "--keys", "total", "--store-as", "x"]
    )
    assert bad.exit_code == 2 and "key=field" in bad.output
    no_sum = run(
        app, ["label", str(tmp_path / "src"), "--out", str(tmp_path / "o4"), "--keys", "total,items[name,price]"]
    )
    assert no_sum.exit_code == 2 and "--sum-to" in no_sum.output
    missing = run(app, ["label", str(tmp_path / "nope"), "--out", str(tmp_path / "o3"), "--keys", "total"])
    assert missing.exit_code == 1 and "no such directory" in missing.output
    shard = run(app, ["label", str(tmp_path / "src"), "--out", str(tmp_path / "o5"), "--keys", "total", "--shard", "1"])
    said = " ".join(shard.output.replace("│", " ").split())  # rich wraps the message in a box
    assert shard.exit_code == 2 and "expected I/N, got '1'" in said and not (tmp_path / "o5").exists()
