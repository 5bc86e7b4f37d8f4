"""Item lists by arithmetic alone (`pipkie label-items`, pipkie.train.sum_items)."""

import json

from typer.testing import CliRunner

from pipkie.cli import app
from pipkie.data import read_dataset
from pipkie.io.document import Document, Word
from pipkie.train.keys import document_items
from pipkie.train.label import DOCS, doc_file_name, write_doc
from pipkie.train.sum_items import line_item, summed_lines

RECEIPT = [
    "CAFE ROMA",
    "Via Roma 1",
    "2 Cappuccino 5.00",
    "Brioche 1,50",
    "1 Acqua 0.5L 2 3.00",
    "SUBTOTAL 9.50",
    "TAX 0.95",
    "TOTAL 10.45",
]


def test_the_lines_that_add_up_to_an_amount_below_them_are_the_items():
    members, target = summed_lines(RECEIPT)
    assert members == [2, 3, 4] and target == 5  # 5.00 + 1.50 + 3.00 = 9.50, the subtotal
    items = [line_item(RECEIPT[i]) for i in members]
    assert items == [
        {"name": "Cappuccino", "quantity": "2", "price": "5.00"},
        {"name": "Brioche", "quantity": None, "price": "1,50"},
        {"name": "Acqua 0.5L", "quantity": "1", "price": "3.00"},  # a trailing 2 after a quantity: not one
    ]
    assert line_item("Burger 1 $21.00") == {"name": "Burger", "quantity": "1", "price": "$21.00"}


def test_summary_lines_amounts_without_cents_and_sums_that_miss_are_no_list():
    # the subtotal and tax add up to the total, but they are summary lines, not items
    assert summed_lines(["SHOP", "Subtotal 10.00", "Tax 1.00", "Total 11.00"]) is None
    assert summed_lines(["SHOP", "Rice 1000", "Tea 500", "TOTAL 1500"]) is None  # no cents: too easy by chance
    assert summed_lines(["SHOP", "Rice 1.00", "Tea 5.00", "TOTAL 7.00"]) is None
    assert summed_lines(["SHOP", "Rice 1.00", "TOTAL 1.00"]) is None  # one line is no list
    # keywords are found inside words (receipts glue them: "#SUBTOTAL28.00"), so "Cornetto" (netto)
    # ends a run as a summary line would: fewer lists, not wrong ones
    assert summed_lines(["Tea 2.00", "Cornetto 1.50", "Cake 3.00", "TOTAL 6.50"]) is None
    # a line without an amount breaks a run: the items after it add up on their own
    assert summed_lines(["Rice 1.00", "Extra cheese", "Tea 2.00", "Cake 3.00", "TOTAL 5.00"]) == ([2, 3], 4)


def test_label_items_writes_the_lists_as_a_words_source_and_skips_receipts_without_one(tmp_path):
    src = tmp_path / "words"
    src.mkdir()
    for name, lines in (("a", RECEIPT), ("b", ["SHOP", "Rice 1.00", "TOTAL 7.00"])):
        words = [
            Word(w, (10 * j, 20 * i, 10 * j + 9, 20 * i + 9))
            for i, ln in enumerate(lines)
            for j, w in enumerate(ln.split())
        ]
        (src / f"{name}.json").write_text(json.dumps({**Document(name, words).to_dict(), "normalized": True}))
    out = tmp_path / "sums"
    result = CliRunner().invoke(app, ["label-items", str(src), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout.strip().splitlines()[-1]) == {"documents": 2, "labelled": 1, "items": 3}
    (doc,) = read_dataset("words", out, "docs")
    assert doc.id == "a" and [(it["name"], it["price"]) for it in document_items(doc)] == [
        ("Cappuccino", "5.00"),
        ("Brioche", "1,50"),
        ("Acqua 0.5L", "3.00"),
    ]
    assert "items.quantity" not in doc.fields  # stored: name and price (LABELLED)
    again = CliRunner().invoke(app, ["label-items", str(src), "--out", str(out)])
    assert again.exit_code == 0 and len(list(read_dataset("words", out, "docs"))) == 1  # rewritten, not added
    (src / "a.json").write_text((src / "b.json").read_text().replace('"b"', '"a"'))  # no run adds up now
    assert CliRunner().invoke(app, ["label-items", str(src), "--out", str(out)]).exit_code == 0
    assert list(read_dataset("words", out, "docs")) == []  # its old labels do not linger
    missing = CliRunner().invoke(app, ["label-items", str(tmp_path / "nowhere"), "--out", str(out)])
    assert missing.exit_code != 0 and "Traceback" not in missing.output


def test_label_items_keeps_the_fields_pipkie_label_stored_in_the_same_folder(tmp_path):
    src, out = tmp_path / "words", tmp_path / "merged"
    src.mkdir()
    words = [
        Word(w, (10 * j, 20 * i, 10 * j + 9, 20 * i + 9))
        for i, ln in enumerate(RECEIPT)
        for j, w in enumerate(ln.split())
    ]
    doc = Document("a", words)
    (out / DOCS).mkdir(parents=True)
    (src / "a.json").write_text(json.dumps({**doc.to_dict(), "normalized": True}))
    write_doc(out / DOCS / doc_file_name("a"), doc, {"store_name": "BAR ROMA", "items.name": ["stale"]})
    assert CliRunner().invoke(app, ["label-items", str(src), "--out", str(out)]).exit_code == 0
    (got,) = read_dataset("words", out, "docs")
    assert got.value("store_name") == "BAR ROMA"  # the other labeller's field stays
    assert [it["name"] for it in document_items(got)] == ["Cappuccino", "Brioche", "Acqua 0.5L"]  # the list is replaced
    (src / "a.json").write_text(json.dumps({**Document("a", words[:3]).to_dict(), "normalized": True}))  # no list now
    assert CliRunner().invoke(app, ["label-items", str(src), "--out", str(out)]).exit_code == 0
    (got,) = read_dataset("words", out, "docs")
    assert got.value("store_name") == "BAR ROMA" and not any(k.startswith("items.") for k in got.fields)
