"""Counterfactual erasure: a field's words taken out of a real document, that key asked, `unknown`."""

import random

from pipkie.io.document import Document, Word, serialize
from pipkie.train.erase import erase_field, maybe_erase
from pipkie.train.keys import sample_schemas
from pipkie.train.mixture import Mixture, templates

RECEIPT = Document(
    id="r1",
    words=[
        Word("LIGHTROOM GALLERY SDN BHD"),
        Word("NO: 28, JALAN ASTANA 1C,"),
        Word("BANDAR BUKIT RAJA, 41050"),
        Word("BILL DATE : 20/12/2017"),
        Word("JALAN"),  # a lone token of the address elsewhere stays
        Word("TOTAL : RM 73.00"),
        Word("CASH : RM 73.00"),
    ],
    fields={
        "company": ["LIGHTROOM GALLERY SDN BHD"],
        "address": ["NO: 28, JALAN ASTANA 1C, BANDAR BUKIT RAJA, 41050"],
        "date": ["20/12/2017"],
        "total": ["73.00"],
    },
)


def test_erasing_takes_the_value_out_and_keeps_the_rest():
    out = erase_field(RECEIPT, "address")
    assert out is not None and "address" not in out.fields and out.fields["total"] == ["73.00"]
    text = serialize(out)
    assert "ASTANA" not in text and "BUKIT" not in text and "41050" not in text
    assert "LIGHTROOM GALLERY" in text and "JALAN" in text  # the lone token outside the value's run
    assert RECEIPT.fields["address"] and "ASTANA" in serialize(RECEIPT)  # the original is untouched

    total = erase_field(RECEIPT, "total")  # a one-token value: every occurrence goes, the labels stay
    assert "73.00" not in serialize(total) and "TOTAL : RM" in serialize(total)
    date = erase_field(RECEIPT, "date")
    assert "20/12/2017" not in serialize(date) and "BILL DATE :" in serialize(date)


def test_a_value_not_found_is_not_erased():
    doc = Document(id="x", words=[Word("HELLO WORLD")], fields={"total": ["9.99"], "company": ["HELLO"]})
    assert erase_field(doc, "total") is None  # not in the words
    assert erase_field(doc, "tips") is None  # no such field
    glued = Document(id="g", words=[Word("NO.5,55,57&59 JALAN")], fields={"address": ["NO.5, 55,57 & 59 JALAN SAGU"]})
    assert erase_field(glued, "address") is None  # most of its tokens are not words of the document
    text_only = Document(id="t", text="total 9.99", fields={"total": ["9.99"]})
    assert erase_field(text_only, "total") is None


def test_maybe_erase_draws_only_when_asked():
    rng = random.Random(0)
    state = rng.getstate()
    assert maybe_erase(RECEIPT, rng, 0.0) == (RECEIPT, None) and rng.getstate() == state
    keys = {maybe_erase(RECEIPT, random.Random(i), 1.0)[1] for i in range(40)}
    assert keys == {"company", "address", "date", "total"}
    assert {maybe_erase(RECEIPT, random.Random(i), 1.0, keys=("total",))[1] for i in range(10)} == {"total"}


def test_an_erased_key_is_asked_and_answers_unknown():
    doc = erase_field(RECEIPT, "address")
    fields = {k: doc.value(k) for k in doc.fields}
    pairs = sample_schemas(fields, random.Random(1), 200, erased=("address",), variation=0.0, absent=0.0)
    asked = [vals["address"] for _, vals in pairs if "address" in vals]
    present = [vals["total"] for _, vals in pairs if "total" in vals]
    assert asked and set(asked) == {None}
    assert abs(len(asked) - len(present)) < 40  # as often as a present key
    # with nothing erased, the draws are those of before the option
    before = sample_schemas(fields, random.Random(1), 50, variation=0.0, absent=0.0)
    assert before == sample_schemas(fields, random.Random(1), 50, erased=(), variation=0.0, absent=0.0)


def test_the_mixture_erases_its_share_of_real_documents(shared_data):
    entry = {"source": "dataset", "name": "sroie", "data_dir": str(shared_data / "sroie"), "split": "train_nodev"}
    plain = Mixture.from_config([{**entry, "limit": 30}], seed=0)
    erasing = Mixture.from_config([{**entry, "limit": 30, "erase": 1.0}], seed=0)
    rng = random.Random(5)
    erased_keys = []
    for _ in range(20):
        source, doc, key = erasing.draw_document(rng)
        if key is None:
            continue
        erased_keys.append(key)
        original = next(d for d in source.docs if d.id == doc.id)
        assert key in original.fields and key not in doc.fields
        assert len(serialize(doc)) < len(serialize(original))
        pairs = templates(
            source, doc, random.Random(0), 4, value_len=len, key_dropout=0.0, absent=0.0, variation=0.0, erased=key
        )
        assert all(key in vals and vals[key] is None for _, vals in pairs)  # always asked at dropout 0
    assert len(erased_keys) >= 15  # SROIE's values are found in its words
    # without the option the draws are the mixture's plain ones
    a, b = random.Random(9), random.Random(9)
    for _ in range(10):
        s, d = plain.draw(a)
        s2, d2, k = plain.draw_document(b)
        assert d is d2 and k is None


def test_generated_receipts_with_items_are_erased_too():
    """A source with a share of item templates: an erased document gets flat templates (asking the
    erased key), the others item templates as before."""
    entry = {"source": "world_receipts", "n": 50, "items": 1.0, "erase": 1.0}
    mixture = Mixture.from_config([entry], seed=3)
    rng, erased, asked = random.Random(2), 0, []
    for _ in range(12):
        source, doc, key = mixture.draw_document(rng)
        pairs = templates(
            source, doc, random.Random(1), 2, value_len=len, key_dropout=0.0, absent=0.0, variation=0.0,
            items=1.0, item_room=400, erased=key,
        )  # fmt: skip
        if key is not None:
            erased += 1
            asked += [vals[key] for _, vals in pairs if key in vals]  # at most 6 keys a template
    assert erased >= 6 and len(asked) >= 4 and set(asked) == {None}
