"""Dataset readers: each takes a directory in its dataset's published layout and yields Documents.

    read_dataset("sroie", "../shared/data/sroie", "train")  # or READERS["sroie"](...)

Every reader has the signature `(data_dir, split, limit=None, **options)` and raises
`pipkie.data.errors.DataError` (naming the file and line) on missing or malformed files. The
formats are described in each module's docstring. `pipkie.data.synthetic` and `pipkie.data.receipts` generate documents
(`pipkie.data.generated`: their registry and a held-out set read as the dataset "generated"),
`pipkie.data.stats` measures them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from pipkie.data.cord import read_cord
from pipkie.data.donut import read_donut, write_donut
from pipkie.data.errors import DataError
from pipkie.data.funsd import read_funsd
from pipkie.data.generated import read_generated
from pipkie.data.kleister import read_kleister_nda
from pipkie.data.poie import read_poie
from pipkie.data.sroie import read_sroie
from pipkie.data.wildreceipt import read_wildreceipt
from pipkie.data.words import read_words
from pipkie.io.document import Document

READERS: dict[str, Callable[..., Iterator[Document]]] = {
    "sroie": read_sroie,
    "wildreceipt": read_wildreceipt,
    "kleister_nda": read_kleister_nda,
    "funsd": read_funsd,
    "cord": read_cord,
    "poie": read_poie,
    "donut": read_donut,
    "words": read_words,
    "generated": read_generated,
}


def read_dataset(
    name: str, data_dir: str | Path, split: str, limit: int | None = None, **options
) -> Iterator[Document]:
    """Documents of `split` of dataset `name` under `data_dir` (options go to the reader)."""
    try:
        reader = READERS[name]
    except KeyError:
        raise ValueError(f"unknown dataset {name!r}; choose one of: {', '.join(sorted(READERS))}") from None
    return reader(data_dir, split, limit=limit, **options)


__all__ = [
    "READERS",
    "DataError",
    "read_dataset",
    "read_cord",
    "read_donut",
    "read_funsd",
    "read_generated",
    "read_kleister_nda",
    "read_poie",
    "read_sroie",
    "read_wildreceipt",
    "read_words",
    "write_donut",
]
