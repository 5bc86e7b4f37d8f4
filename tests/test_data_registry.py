"""The dataset registry."""

from pathlib import Path

import pytest

from pipkie.data import READERS, DataError, read_dataset

FIXTURES = Path(__file__).parent / "fixtures"


def test_registry_names():
    assert set(READERS) == {
        "sroie",
        "wildreceipt",
        "kleister_nda",
        "funsd",
        "cord",
        "poie",
        "donut",
        "words",
        "generated",
    }


def test_read_dataset_passes_split_and_limit():
    assert [d.id for d in read_dataset("poie", FIXTURES / "poie", "test", limit=1)] == ["images_label_0001"]
    assert len(list(read_dataset("cord", FIXTURES / "cord", "train"))) == 2


def test_unknown_name_lists_choices():
    with pytest.raises(ValueError, match=r"unknown dataset 'xfund'.*cord.*sroie"):
        read_dataset("xfund", ".", "train")


@pytest.mark.parametrize("name", sorted(READERS))
def test_every_reader_raises_data_error_on_a_missing_directory(tmp_path, name):
    with pytest.raises(DataError, match=str(tmp_path)):
        list(read_dataset(name, tmp_path / "absent", "train"))
