"""One printed word answers one key (pipkie.decoding.disjoint), for every decoder alike."""

from pipkie.decoding.disjoint import disjoint
from pipkie.decoding.results import FieldResult
from pipkie.model.groups import ItemsResult
from pipkie.schema import KeySchema

TEXT = "Goldbergs#88\nHartsfieldJackson\nInternationalAirport\nAtlanta,GA\nDATE 11/30/16\nTOTAL $9.00"


def _values(pred):
    return {k: r.value for k, r in pred.items()}


def test_a_value_that_runs_into_the_next_keys_ends_where_it_starts():
    pred = {
        "company": FieldResult("Goldbergs#88 HartsfieldJackson InternationalAirport", 0.57, [1, 2]),
        "address": FieldResult("HartsfieldJackson InternationalAirport Atlanta,GA", 0.78),
    }
    out = disjoint(pred, TEXT)
    assert _values(out) == {"company": "Goldbergs#88", "address": "HartsfieldJackson InternationalAirport Atlanta,GA"}
    assert (out["company"].confidence, out["company"].tokens) == (0.57, [1, 2])  # confidence and tokens stay


def test_a_value_over_all_of_another_is_cut_before_it():
    pred = {"address": FieldResult("Atlanta,GA DATE 11/30/16", 0.6), "date": FieldResult("11/30/16", 0.99)}
    assert disjoint(pred, TEXT)["address"].value == "Atlanta,GA DATE"


def test_the_more_confident_value_is_not_cut_by_a_less_confident_one():
    pred = {
        "address": FieldResult("InternationalAirport Atlanta,GA", 0.96),
        "date": FieldResult("Atlanta,GA", 0.52),  # an untyped date answering an address line
    }
    assert _values(disjoint(pred, TEXT)) == _values(pred)


def test_values_that_start_together_apart_or_ambiguous_are_left_alone():
    cases = [
        {"company": FieldResult("Goldbergs#88", 0.5), "address": FieldResult("Goldbergs#88 HartsfieldJackson", 0.9)},
        {"company": FieldResult("Atlanta,GA", 0.5), "address": FieldResult("Atlanta,GA", 0.9)},  # the same words
        {"company": FieldResult("Goldbergs#88", 0.5), "total": FieldResult("$9.00", 0.9)},  # apart
        {"a": FieldResult("TOTAL $9", 0.1), "b": FieldResult("$9.00", 0.9)},  # `$9` inside a word: not placed
        {"a": FieldResult("Atlanta,GA 2016-11-30", 0.1), "b": FieldResult("2016-11-30", 0.9)},  # not in the text
        {"a": FieldResult(None, 0.1), "b": FieldResult("11/30/16", 0.9)},
    ]
    for pred in cases:
        assert _values(disjoint(pred, TEXT)) == _values(pred)
    twice = "ACME\nACME FOODS\nFOODS"
    pred = {"company": FieldResult("ACME", 0.1), "x": FieldResult("FOODS", 0.9)}  # `ACME` occurs twice
    assert _values(disjoint(pred, twice)) == _values(pred)


def test_list_items_are_left_alone():
    items = ItemsResult(items=[{"name": FieldResult("HartsfieldJackson InternationalAirport", 0.1)}])
    pred = {"items": items, "address": FieldResult("InternationalAirport Atlanta,GA", 0.9)}
    out = disjoint(pred, TEXT)
    assert out["items"] is items and out["address"].value == "InternationalAirport Atlanta,GA"


def test_every_decoder_applies_it_with_snapping(monkeypatch):
    from pipkie.decoding import get_decoder

    raw = {
        "company": FieldResult("Goldbergs#88 HartsfieldJackson", 0.5),
        "address": FieldResult("HartsfieldJackson", 0.9),
    }
    schema = KeySchema.parse("company,address")
    for name in ("pip", "ar-forced", "ar-free"):
        dec = get_decoder(name)
        monkeypatch.setattr(type(dec), "decode", lambda self, *a, **k: [dict(raw)])
        assert dec(None, None, [TEXT], [schema])[0]["company"].value == "Goldbergs#88"
        assert dec(None, None, [TEXT], [schema], snap=False)[0]["company"].value == "Goldbergs#88 HartsfieldJackson"
