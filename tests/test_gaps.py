"""Lines a decoded list skipped between two of its items, filled by their neighbours' layout
(`pipkie.decoding.gaps`): which lines count, how their fields are read, and that every decoder gets it."""

from __future__ import annotations

from pipkie.decoding.gaps import elements, fill_gaps, fill_prediction, shape
from pipkie.decoding.results import FieldResult
from pipkie.model.groups import ItemsResult
from tests.test_extract import tiny_extractor, tiny_model_dir  # noqa: F401

RECEIPT = """Max'sCafe
Tbl31/1 Chk1441 Gst2
1 BenSPECIAL 12.50
YELP
Opens$Disc 2.05-
1 Caprese 10.00
AddChicken 1.00
1 PineappleBellin 7.00
Subtotal 24.45
1 Coffee 3.00"""


def item(name, price, quantity=None, conf=0.9):
    return {
        "name": FieldResult(name, conf),
        "quantity": FieldResult(quantity, conf if quantity else 0.0),
        "price": FieldResult(price, conf),
    }


def values(items):
    return [{k: f.value for k, f in it.items()} for it in items]


def test_a_line_is_read_as_elements_of_amounts_counts_and_runs_of_words():
    assert elements("2x Weissbier dunkel a 3,30 26,40 1") == [
        ("count", "2x"),
        ("words", "Weissbier dunkel a"),
        ("amount", "3,30"),
        ("amount", "26,40"),
        ("count", "1"),
    ]
    assert shape("Opens$Disc 2.05-") == ("words", "amount")
    assert shape("*SAVINGS 3.00*") == ("words", "amount")


def test_a_skipped_line_laid_out_like_its_neighbours_is_read_as_they_were():
    got = fill_gaps([item("BenSPECIAL", "12.50", "1", 0.9), item("PineappleBellin", "7.00", "1", 0.7)], RECEIPT)
    assert values(got) == [
        {"name": "BenSPECIAL", "quantity": "1", "price": "12.50"},
        {"name": "Caprese", "quantity": "1", "price": "10.00"},  # `1 Caprese 10.00`: the same shape
        {"name": "PineappleBellin", "quantity": "1", "price": "7.00"},
    ]  # `YELP`, `Opens$Disc 2.05-` and `AddChicken 1.00` are laid out otherwise
    filled = got[1]
    assert all(f.layout for f in filled.values()) and not any(f.layout for f in got[0].values())
    assert filled["price"].confidence == 0.7  # the lower of the two neighbours'


def test_a_field_the_neighbour_left_empty_stays_empty_and_lines_outside_the_list_are_not_filled():
    got = fill_gaps([item("BenSPECIAL", "12.50"), item("PineappleBellin", "7.00")], RECEIPT)
    assert values(got)[1] == {"name": "Caprese", "quantity": None, "price": "10.00"}
    assert got[1]["quantity"].confidence == 0.0
    # `1 Coffee 3.00` after the last item, and everything before the first, stay out
    assert len(fill_gaps([item("Caprese", "10.00", "1"), item("PineappleBellin", "7.00", "1")], RECEIPT)) == 2


def test_words_around_the_value_in_a_run_are_dropped_on_the_filled_line_too():
    text = "8x Weissbierdunkel a 3,30 26,40 1\n1x Gross Wasser a 2,40 2,40 1\n1x Gyros a 8,90 8,90 1"
    got = fill_gaps([item("Weissbierdunkel", "26,40", "8x"), item("Gyros", "8,90", "1x")], text)
    assert values(got)[1] == {"name": "Gross Wasser", "quantity": "1x", "price": "2,40"}


def test_an_item_not_on_one_line_or_not_in_the_text_leaves_its_gaps_alone():
    two_lines = "LEFTY MIX\n4.99\nLIME 0.99\nSALT 1.25"
    assert len(fill_gaps([item("LEFTY MIX", "4.99"), item("SALT", "1.25")], two_lines)) == 2
    assert len(fill_gaps([item("BenSPECIAL", "12.50"), item("Caprice", "7.00")], RECEIPT)) == 2
    assert fill_gaps([], RECEIPT) == []


def test_flat_keys_pass_through_and_lists_are_filled(tiny_extractor):
    from pipkie.decoding.pip import PipDecoder
    from pipkie.schema import KeySchema

    class Fixed(PipDecoder):
        """Answers the same two items whatever the document (a decoder that skipped `1 Caprese`)."""

        def decode(self, model, builder, texts, schemas, **kw):
            return [
                {
                    "total": FieldResult("24.45", 0.8),
                    "items": ItemsResult([item("BenSPECIAL", "12.50", "1"), item("PineappleBellin", "7.00", "1")]),
                }
                for _ in texts
            ]

    schema = KeySchema.resolve("total,items[name,quantity,price]")
    pred = Fixed()(tiny_extractor.model, tiny_extractor.builder, [RECEIPT], [schema])[0]
    assert pred["total"].value == "24.45"
    assert [it["name"].value for it in pred["items"].items] == ["BenSPECIAL", "Caprese", "PineappleBellin"]
    assert fill_prediction({"total": FieldResult(None, 0.0)}, RECEIPT)["total"].value is None


def test_only_layout_read_fields_say_so_in_the_json():
    from pipkie.extract import Extraction, Field

    out = Extraction(
        "r", {"items": [{"name": Field("Coke", 0.9)}, {"name": Field("Caprese", 0.7, layout=True)}]}, "pip", 0.1
    ).to_dict()
    assert [("layout" in it["name"], it["name"].get("layout")) for it in out["fields"]["items"]] == [
        (False, None),
        (True, True),
    ]
