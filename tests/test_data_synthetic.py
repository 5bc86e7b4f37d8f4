"""Synthetic receipts and forms: determinism, rendering, options."""

import pytest
from PIL import Image

from pipkie.data.noise import ocr_noise
from pipkie.data.synthetic import FORM_FIELDS, generate_forms, generate_receipts
from pipkie.io.document import serialize

RECEIPT_KEYS = {"company", "date", "address", "total"}


def test_receipts_deterministic_and_rendered(tmp_path):
    a = list(generate_receipts(4, seed=7, out_dir=tmp_path / "a"))
    b = list(generate_receipts(4, seed=7, out_dir=tmp_path / "b"))
    assert [(d.id, d.words, d.fields, d.page_sizes) for d in a] == [(d.id, d.words, d.fields, d.page_sizes) for d in b]
    assert (tmp_path / "a" / f"{a[0].id}.png").read_bytes() == (tmp_path / "b" / f"{b[0].id}.png").read_bytes()
    assert [d.fields for d in generate_receipts(4, seed=8, render=False)] != [d.fields for d in a]
    for doc in a:
        assert set(doc.fields) <= RECEIPT_KEYS and doc.words
        with Image.open(doc.images[0]) as im:
            im.load()
            assert im.size == doc.page_sizes[0]
        assert all(0 <= v <= 1000 for w in doc.words for v in w.box)


def test_ground_truth_is_on_the_page():
    for doc in generate_receipts(10, seed=1, render=False, missing_prob=0.0):
        assert set(doc.fields) == RECEIPT_KEYS
        text = " ".join(serialize(doc).split())
        assert doc.fields["total"][0] in text and doc.fields["date"][0] in text
        assert doc.fields["address"][0] in text  # address lines joined by spaces, as in SROIE


def test_render_false_gives_the_same_words_and_doc_i_depends_only_on_seed_and_i(tmp_path):
    drawn = list(generate_receipts(3, seed=2, out_dir=tmp_path, skew=2.0))
    fast = list(generate_receipts(5, seed=2, render=False, skew=2.0))
    assert [(d.words, d.fields) for d in drawn] == [(d.words, d.fields) for d in fast[:3]]
    assert all(not d.images for d in fast)


def test_forms(tmp_path):
    forms = list(generate_forms(3, seed=4, out_dir=tmp_path))
    assert forms == list(generate_forms(3, seed=4, out_dir=tmp_path))
    for doc in forms:
        assert doc.fields and set(doc.fields) <= set(FORM_FIELDS)
        with Image.open(doc.images[0]) as im:
            assert im.size == doc.page_sizes[0]


def test_options():
    assert all(not d.fields for d in generate_receipts(3, seed=0, render=False, missing_prob=1.0))
    clean = list(generate_receipts(3, seed=0, render=False))
    noisy = list(generate_receipts(3, seed=0, render=False, noise=0.2))
    assert [d.fields for d in clean] == [d.fields for d in noisy]
    assert [w.text for w in clean[0].words] != [w.text for w in noisy[0].words]
    plain = list(generate_forms(2, seed=0, render=False, layout_variety=False))
    assert all(d.page_sizes[0][0] == 850 for d in plain)
    with pytest.raises(ValueError, match="out_dir"):
        generate_receipts(1, seed=0)


def test_ocr_noise():
    import random

    assert ocr_noise("TOTAL 10.00", random.Random(0), 0.0) == "TOTAL 10.00"
    assert ocr_noise("TOTAL 10.00", random.Random(0), 1.0) != "TOTAL 10.00"
