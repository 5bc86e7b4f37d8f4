"""Values snapped to the document's words (pipkie.decoding.snap), for every decoder alike."""

import pytest

from pipkie.decoding.results import FieldResult
from pipkie.decoding.snap import snap_predictions, snap_to_words
from pipkie.model.groups import ItemsResult
from pipkie.schema import KeySchema

TEXT = "BIBIM $13.99\nPORKDUMPLINT1 $14.99\nMR. D.I.Y. SDN BHD (126926-H)\nTOTAL $60.44\n13.99"


@pytest.mark.parametrize(
    "value, snapped",
    [
        ("PORKD", "PORKDUMPLINT1"),  # cut inside a word
        ("$60.4", "$60.44"),  # ... inside a number
        ("SDN B", "SDN BHD"),
        ("13.", "13.99"),  # two occurrences, one completion
        ("$1", "$1"),  # two completions ($13.99, $14.99): ambiguous, left alone
        ("SDN BHD (", "SDN BHD ("),  # ends in punctuation: a token boundary
        ("MR. D.I.Y", "MR. D.I.Y"),  # stops before punctuation (`.`): whole
        ("BIBIM", "BIBIM"),  # whole
        ("$13.99", "$13.99"),
        ("2016-12-30", "2016-12-30"),  # not in the text (normalised): left alone
        (None, None),
        ("", ""),
    ],
)
def test_snap_to_words(value, snapped):
    assert snap_to_words(value, TEXT) == snapped


@pytest.mark.parametrize(
    "value, text, snapped",
    [
        ("ILIO'", "ILIO'S\nRestaurant", "ILIO'S"),  # an apostrophe before a letter is inside a word
        ("CIR CENT", "CIR\nCENTRAL\nBLDG", "CIR CENTRAL"),  # matched over a line break, most of it read
        ("THE ROUND TOWER K", "THE\nROUND\nTOWER\nKELLSCO.MEATH", "THE ROUND TOWER"),  # a spill: cut
        ("CAFFE'TORINO D", "CAFFE'TORINO\nDICAPOZZO", "CAFFE'TORINO"),
        ("SDN B", "SDN BHD", "SDN BHD"),  # a short rest on the same line is completed, not cut
        ("KE", "KELLSCO.MEATH", "KELLSCO.MEATH"),  # a one-word value is never cut to nothing
        ("TOWER K", "TOWER\nKELLS\nTOWER\nKO", "TOWER K"),  # two different rests: left alone
    ],
)
def test_values_over_lines_and_spills(value, text, snapped):
    assert snap_to_words(value, text) == snapped


def test_a_value_whole_somewhere_is_not_extended():
    assert snap_to_words("ACME", "ACMEFOODS\nACME") == "ACME"


def test_snap_predictions_reaches_flat_values_and_items_and_keeps_confidences():
    preds = [
        {
            "total": FieldResult("$60.4", 0.8, [1, 2]),
            "date": FieldResult(None, 0.1),
            "items": ItemsResult(items=[{"name": FieldResult("PORKD", 0.5), "price": FieldResult("$14.99", 0.9)}]),
        }
    ]
    snap_predictions(preds, [TEXT])
    p = preds[0]
    assert (p["total"].value, p["total"].confidence, p["total"].tokens) == ("$60.44", 0.8, [1, 2])
    assert p["date"].value is None
    assert p["items"].value == [{"name": "PORKDUMPLINT1", "price": "$14.99"}]


def test_every_decoder_snaps_unless_asked_not_to(monkeypatch):
    from pipkie.decoding import get_decoder

    for name in ("pip", "ar-forced", "ar-free"):
        dec = get_decoder(name)
        monkeypatch.setattr(type(dec), "decode", lambda self, *a, **k: [{"total": FieldResult("$60.4", 0.9)}])
        plain, typed = KeySchema.parse("total"), KeySchema.parse("total:date")
        assert dec(None, None, [TEXT], [plain])[0]["total"].value == "$60.44"
        assert dec(None, None, [TEXT], [plain], snap=False)[0]["total"].value == "$60.4"
        assert dec(None, None, [TEXT], [typed])[0]["total"].value is None  # and a typed key's rule, last
