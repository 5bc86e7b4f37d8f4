"""World receipts and invoices: determinism, ground truth on the page, glue, line items, locales."""

import random

from pipkie.data import locales as L
from pipkie.data.receipts import generate_invoices, generate_world_receipts
from pipkie.data.vocab import INVOICE_KEYS, ITEM_FIELDS, RECEIPT_KEYS
from pipkie.io.document import serialize


def test_document_i_depends_only_on_seed_and_i(tmp_path):
    all_ = list(generate_world_receipts(6, seed=3, render=False))
    assert list(generate_world_receipts(6, seed=3, start=4, render=False)) == all_[4:]
    drawn = list(generate_world_receipts(2, seed=3, out_dir=tmp_path))
    assert [(d.words, d.fields) for d in drawn] == [(d.words, d.fields) for d in all_[:2]]
    assert all((tmp_path / f"{d.id}.png").exists() for d in drawn)
    assert [d.fields for d in generate_world_receipts(6, seed=4, render=False)] != [d.fields for d in all_]


def test_every_value_is_printed_and_glued_documents_have_no_spaces():
    docs = list(generate_world_receipts(150, seed=0, render=False)) + list(generate_invoices(40, seed=0, render=False))
    glued, contiguous = 0, []
    for doc in docs:
        text = serialize(doc)
        words = {w.text for w in doc.words}
        flat = " ".join(text.split())
        for key, values in doc.fields.items():
            assert key in RECEIPT_KEYS + INVOICE_KEYS or key.removeprefix("items.") in ITEM_FIELDS
            for v in values:
                if key.startswith("items.") and not v:
                    continue
                # printed: contiguous in reading order, or (a two-column invoice) its segments are on the page
                assert v in flat or all(p in flat for p in v.split(" ")), (doc.id, key, v)
                contiguous.append(v in flat)
        if all(" " not in w.text for w in doc.words):  # glued: a key's value is made of whole segments
            glued += 1
            assert all(
                p in words
                for k, vs in doc.fields.items()
                if not k.startswith("items.")
                for v in vs
                for p in v.split(" ")
                if p
            )
    assert 40 <= glued <= 90  # about 40% of receipts and 15% of invoices
    assert sum(contiguous) / len(contiguous) > 0.97


def test_line_items_are_parallel_columns():
    for doc in generate_world_receipts(40, seed=1, render=False):
        n = len(doc.fields["items.name"])
        assert n >= 1 and all(len(doc.fields[f"items.{f}"]) == n for f in ITEM_FIELDS)
        assert all(doc.fields["items.price"])  # every line prints its amount


def test_keys_and_locales_vary():
    docs = list(generate_world_receipts(300, seed=2, render=False))
    seen = {k for d in docs for k in d.fields}
    assert set(RECEIPT_KEYS) <= seen
    totals = [d.fields["total"][0] for d in docs if "total" in d.fields]
    assert any("," in t and "." not in t for t in totals) and any("." in t for t in totals)
    assert len({d.fields["date"][0][:2] for d in docs if "date" in d.fields}) > 20


def test_money_and_dates_follow_the_locale():
    de, us = L.LOCALES["de"], L.LOCALES["us"]
    assert L.money(1234.5, de, "€") == "1.234,50€" and L.money(1234.5, de, "€", glued=False) == "1.234,50 €"
    assert L.money(60.44, us, "$") == "$60.44" and L.money(-3.1, us, "") == "-3.10"
    from datetime import date

    rng = random.Random(0)
    assert L.format_date(date(2016, 12, 30), "{mm}/{dd}/{Y}", rng) == "12/30/2016"
    assert L.format_date(date(2016, 12, 30), "{dd}.{mm}.{y}", rng) == "30.12.16"
    assert L.format_date(date(2016, 12, 30), "{d} {b} {Y}", rng).lower() == "30 dec 2016"
    assert len(L.phone(us, rng)) >= 12


def test_rules_is_the_share_of_receipts_printed_with_dashed_rules():
    """`rules` < 1 leaves the dashed rule lines off some receipts (WildReceipt's transcriptions have
    none); their fields and items are the same; at 1 the receipts are those of the default."""
    import pytest

    ruled = lambda docs: [any(set(line) == {"-"} for line in serialize(d).split("\n")) for d in docs]  # noqa: E731
    default = list(generate_world_receipts(30, seed=2, render=False))
    assert all(ruled(default))
    assert [serialize(d) for d in generate_world_receipts(30, seed=2, render=False, rules=1.0)] == [
        serialize(d) for d in default
    ]
    some = list(generate_world_receipts(30, seed=2, render=False, rules=0.3))
    assert 3 <= sum(ruled(some)) <= 18
    bare = list(generate_world_receipts(30, seed=2, render=False, rules=0.0))
    assert not any(ruled(bare))
    assert [d.items({"name": "items.name", "price": "items.price"}) for d in bare] == [
        d.items({"name": "items.name", "price": "items.price"}) for d in some
    ]  # the same receipts, ruled or not
    with pytest.raises(ValueError, match="rules must be a share between 0 and 1"):
        list(generate_world_receipts(1, render=False, rules=1.5))
