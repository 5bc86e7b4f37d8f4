"""Dataset statistics: token lengths and how often the ground-truth values appear in the input text.

    python -m pipkie.data.stats --dataset sroie --data-dir ../shared/data/sroie --split train \\
        --tokenizer /path/to/tokenizer

`length_stats` counts tokens of the serialized document (`pipkie.io.document.serialize`, the model
input) and of each ground-truth value, per key. `value_coverage` measures, per key, the fraction of
values that occur in the serialized text: verbatim (exact substring), after whitespace
normalisation (runs of spaces/newlines -> one space, both sides; a value spanning several lines
still counts), and fuzzily (rapidfuzz `fuzz.partial_ratio` >= 90 on the normalised strings). A value
that is not even fuzzily present cannot be copied from the text by an extractive model.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Iterable
from typing import Any

from rapidfuzz import fuzz

from pipkie.io.document import Document, serialize


def _percentile(values: list[int], q: float) -> float:
    """Nearest-rank percentile (q in 0-100) of a non-empty list."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def _summary(values: list[int]) -> dict[str, float]:
    if not values:
        return {"n": 0, "mean": 0.0, "p50": 0, "p95": 0, "max": 0}
    return {
        "n": len(values),
        "mean": sum(values) / len(values),
        "p50": _percentile(values, 50),
        "p95": _percentile(values, 95),
        "max": max(values),
    }


def _count_tokens(tokenizer: Any, text: str) -> int:
    if hasattr(tokenizer, "encode"):
        try:
            return len(tokenizer.encode(text, add_special_tokens=False))
        except TypeError:
            return len(tokenizer.encode(text))
    return len(tokenizer(text))  # any callable text -> tokens


def length_stats(docs: Iterable[Document], tokenizer: Any, keys: Iterable[str] | None = None) -> dict:
    """{"documents": {n, mean, p50, p95, max}, "values": {key: {n, mean, p50, p95, max}}} in tokens.

    tokenizer: a Hugging Face tokenizer (`encode`) or any callable text -> list of tokens.
    keys: the keys to report (default: every key seen); each value of a multi-valued key counts once.
    """
    wanted = set(keys) if keys is not None else None
    doc_lengths: list[int] = []
    value_lengths: dict[str, list[int]] = {k: [] for k in (keys or [])}
    for doc in docs:
        doc_lengths.append(_count_tokens(tokenizer, serialize(doc)))
        for key, values in doc.fields.items():
            if wanted is None or key in wanted:
                value_lengths.setdefault(key, []).extend(_count_tokens(tokenizer, v) for v in values)
    return {"documents": _summary(doc_lengths), "values": {k: _summary(v) for k, v in value_lengths.items()}}


def normalize_ws(text: str) -> str:
    return re.sub(r"\s+", " ", text).strip()


def value_coverage(docs: Iterable[Document], keys: Iterable[str] | None = None, threshold: float = 90) -> dict:
    """{key: {"n", "verbatim", "normalized", "fuzzy"}}: fractions of the key's values found in the text."""
    wanted = set(keys) if keys is not None else None
    counts: dict[str, list[int]] = {k: [0, 0, 0, 0] for k in (keys or [])}
    for doc in docs:
        text = serialize(doc)
        norm = normalize_ws(text)
        for key, values in doc.fields.items():
            if wanted is not None and key not in wanted:
                continue
            c = counts.setdefault(key, [0, 0, 0, 0])
            for value in values:
                v = normalize_ws(value)
                c[0] += 1
                c[1] += value.strip() in text
                c[2] += v in norm
                c[3] += v in norm or fuzz.partial_ratio(v, norm) >= threshold
    return {
        k: {"n": n, "verbatim": a / n if n else 0.0, "normalized": b / n if n else 0.0, "fuzzy": f / n if n else 0.0}
        for k, (n, a, b, f) in counts.items()
    }


def format_table(header: list[str], rows: list[list[Any]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned."""
    cells = [[str(c) for c in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(header)]

    def fmt(row: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))

    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in cells])


def coverage_table(coverage: dict) -> str:
    rows = [[k, v["n"]] + [f"{v[c]:.3f}" for c in ("verbatim", "normalized", "fuzzy")] for k, v in coverage.items()]
    return format_table(["key", "n", "verbatim", "ws-normalised", "fuzzy>=90"], rows)


def length_table(stats: dict) -> str:
    rows = [["document", *_cells(stats["documents"])]]
    rows += [[f"value:{k}", *_cells(v)] for k, v in stats["values"].items()]
    return format_table(["tokens of", "n", "mean", "p50", "p95", "max"], rows)


def _cells(s: dict) -> list[str]:
    return [str(s["n"]), f"{s['mean']:.1f}", str(s["p50"]), str(s["p95"]), str(s["max"])]


def main(argv: list[str] | None = None) -> None:
    from pipkie.data import READERS, read_dataset

    p = argparse.ArgumentParser(prog="python -m pipkie.data.stats", description=__doc__.split("\n")[0])
    p.add_argument("--dataset", required=True, choices=sorted(READERS))
    p.add_argument("--data-dir", required=True)
    p.add_argument("--split", default="train")
    p.add_argument("--tokenizer", help="path or hub id for transformers.AutoTokenizer (skip lengths if absent)")
    p.add_argument("--limit", type=int)
    p.add_argument("--keys", help="comma-separated keys to report (default: all)")
    args = p.parse_args(argv)
    keys = args.keys.split(",") if args.keys else None
    docs = list(read_dataset(args.dataset, args.data_dir, args.split, limit=args.limit))
    print(f"{args.dataset} {args.split}: {len(docs)} documents\n")
    print("Value coverage (fraction of ground-truth values found in the serialized text)")
    print(coverage_table(value_coverage(docs, keys)))
    if args.tokenizer:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(args.tokenizer)
        print(f"\nToken lengths ({args.tokenizer})")
        print(length_table(length_stats(docs, tok, keys)))


if __name__ == "__main__":
    main()
