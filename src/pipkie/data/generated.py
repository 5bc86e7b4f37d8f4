"""Generated documents: one registry of generators, and a held-out set of them read as a dataset.

    read_dataset("generated", "world_receipts", "dev", limit=200)   # pipkie evaluate --dataset generated

`GENERATED` names the document generators (`pipkie.data.receipts`, `pipkie.data.synthetic`) that
training mixtures draw from (`pipkie.train.mixture`). Training draws document i of a generator with
seed `TrainConfig.seed + 1` and i below the source's `n` (at most a few 10,000s); the held-out set
is documents from index `HELD_OUT_START` on, with its own seed, so no training run of this project
has seen one. It scores what a model learnt from generated data (line items above all, whose real
labelled data is scarce) apart from how that carries over to real documents.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from pipkie.data.errors import DataError
from pipkie.io.document import Document

HELD_OUT_SEED = 1000
HELD_OUT_START = 1_000_000  # far above any mixture's `n`
DEFAULT_SIZE = 200


def _generators() -> dict[str, Callable[..., Iterator[Document]]]:
    from pipkie.data import receipts, synthetic

    return {
        "world_receipts": receipts.generate_world_receipts,
        "invoices": receipts.generate_invoices,
        "forms": synthetic.generate_forms,
        "receipts_my": synthetic.generate_receipts,
    }


GENERATED = ("world_receipts", "invoices", "forms", "receipts_my")


def generate(kind: str, i: int, seed: int, noise: float = 0.0, rules: float = 1.0) -> Document:
    """Document `i` of generator `kind` (it depends only on kind, seed and i), without an image;
    `rules`: the share printed with dashed rule lines (`pipkie.data.layout.lay_out`)."""
    try:
        make = _generators()[kind]
    except KeyError:
        raise ValueError(f"unknown generator {kind!r}; choose one of: {', '.join(GENERATED)}") from None
    return next(iter(make(i + 1, seed=seed, render=False, noise=noise, start=i, rules=rules)))


def read_generated(
    data_dir: str | Path, split: str = "dev", limit: int | None = None, noise: float = 0.0
) -> Iterator[Document]:
    """The held-out documents of generator `data_dir` (its name: world_receipts, invoices, forms,
    receipts_my): `limit` of them (default 200), split "dev" only (there is nothing to train on)."""
    kind = Path(data_dir).name
    if kind not in GENERATED:
        raise DataError(Path(data_dir), f"not a generator; choose one of: {', '.join(GENERATED)}")
    if split != "dev":
        raise DataError(Path(data_dir), f"generated documents have one split, 'dev' (got {split!r})")
    n = DEFAULT_SIZE if limit is None else limit
    make = _generators()[kind]
    yield from make(HELD_OUT_START + n, seed=HELD_OUT_SEED, render=False, noise=noise, start=HELD_OUT_START)
