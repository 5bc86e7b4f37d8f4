"""Generated documents: one registry for mixtures and the held-out set read as a dataset."""

import pytest

from pipkie.data import DataError, read_dataset
from pipkie.data.generated import HELD_OUT_START, generate
from pipkie.train.keys import document_items
from pipkie.train.mixture import Mixture


def test_held_out_set_is_fixed_and_starts_far_above_training_indices():
    a = list(read_dataset("generated", "world_receipts", "dev", limit=3))
    b = list(read_dataset("generated", "world_receipts", "dev", limit=3))
    assert [d.id for d in a] == [d.id for d in b] and len(a) == 3
    assert [d.words[0].text for d in a] == [d.words[0].text for d in b]
    assert all(d.id.endswith(f"-{HELD_OUT_START + i}") for i, d in enumerate(a))


def test_held_out_receipts_carry_line_items():
    docs = list(read_dataset("generated", "world_receipts", "dev", limit=10))
    assert sum(len(document_items(d)) for d in docs) > 10
    assert all(it["name"] for d in docs for it in document_items(d))


def test_mixture_draws_from_the_same_generators():
    (source,) = Mixture.from_config([{"source": "invoices", "n": 50}], seed=4).sources
    doc = source.get(7, seed=5)
    assert doc.id == generate("invoices", 7, 5).id
    assert [w.text for w in doc.words] == [w.text for w in generate("invoices", 7, 5).words]


def test_held_out_set_refuses_other_splits_and_unknown_generators():
    with pytest.raises(DataError, match="one split, 'dev'"):
        list(read_dataset("generated", "world_receipts", "train"))
    with pytest.raises(DataError, match="not a generator.*world_receipts"):
        list(read_dataset("generated", "cheques", "dev"))
    with pytest.raises(ValueError, match="unknown generator 'cheques'"):
        generate("cheques", 0, 0)
