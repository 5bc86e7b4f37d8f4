"""A value never ends in a label (pipkie.decoding.labels), for every decoder alike."""

from pipkie.decoding.labels import drop_labels, without_label
from pipkie.decoding.results import FieldResult
from pipkie.model.groups import ItemsResult
from pipkie.schema import KeySchema


def test_a_value_read_into_the_next_label_loses_it():
    assert without_label("12 Main St Tel:") == "12 Main St"
    assert without_label("12 Main St Tel: Fax:") == "12 Main St"
    assert without_label("Date:") is None and without_label("1:") is None  # a label alone: unknown
    for kept in ("Tel: 0143263304", "12:30", "NO: 1-1&2 JLN 13/9", "ACME", "::::", "", None):  # label first, time
        assert without_label(kept) == kept


def test_flat_values_and_summary_lines():
    items = [
        {"name": FieldResult("Caprese", 0.9), "price": FieldResult("10.00", 0.9)},
        {"name": FieldResult("SUBTOTAL:", 0.8), "price": FieldResult("24.45", 0.9)},  # a summary line
        {"name": FieldResult(None, 0.5), "price": FieldResult("1.00", 0.9)},
    ]
    pred = {
        "address": FieldResult("Date:", 0.59, [1, 2], truncated=True),
        "company": FieldResult("ACME FOODS Tel:", 0.7),
        "total": FieldResult("24.45", 0.99),
        "items": ItemsResult(items=items, confidence=0.8),
    }
    out = drop_labels(pred)
    assert out["address"] == FieldResult(None, 0.59, [1, 2], truncated=False)  # confidence kept
    assert out["company"].value == "ACME FOODS" and out["total"] is pred["total"]
    assert [it["price"].value for it in out["items"].items] == ["10.00", "1.00"] and out["items"].confidence == 0.8


def test_every_decoder_applies_it(monkeypatch):
    from pipkie.decoding import get_decoder

    raw = {"address": FieldResult("12 Main St Tel:", 0.5), "company": FieldResult("Date:", 0.4)}
    schema = KeySchema.parse("address,company")
    for name in ("pip", "ar-forced", "ar-free"):
        dec = get_decoder(name)
        monkeypatch.setattr(type(dec), "decode", lambda self, *a, **k: [dict(raw)])
        out = dec(None, None, ["12 Main St Tel: 555-0100\nDate: 12/30/2016"], [schema])[0]
        assert (out["address"].value, out["company"].value) == ("12 Main St", None)


def test_a_summary_line_filled_in_by_layout_is_left_out_too(monkeypatch):
    from pipkie.decoding import get_decoder

    def item(name, price):
        return {"name": FieldResult(name, 0.9), "price": FieldResult(price, 0.9)}

    text = "Caprese 10.00\nSUBTOTAL: 24.45\nBellini 7.00\nSalad 7.45"  # the summary line between two items
    raw = {"items": ItemsResult(items=[item("Caprese", "10.00"), item("Bellini", "7.00")], confidence=0.9)}
    schema = KeySchema.parse("items[name,price]")
    dec = get_decoder("pip")

    def patch():
        monkeypatch.setattr(type(dec), "decode", lambda self, *a, **k: [dict(raw)])
        monkeypatch.setattr("pipkie.model.groups.within_lines", lambda builder, schema, text: schema)

    patch()
    monkeypatch.setattr("pipkie.decoding.base.drop_labels", lambda p: p)  # without the rule: filled in
    assert [it["name"].value for it in dec(None, None, [text], [schema])[0]["items"].items] == [
        "Caprese",
        "SUBTOTAL:",
        "Bellini",
    ]
    monkeypatch.undo()
    patch()
    names = [it["name"].value for it in dec(None, None, [text], [schema])[0]["items"].items]
    assert names == ["Caprese", "Bellini"]
