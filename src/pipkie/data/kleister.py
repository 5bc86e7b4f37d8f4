"""Kleister-NDA (long born-digital contracts, text only), in its GEval/Gonito challenge layout.

    {data_dir}/in-header.tsv        column names of in.tsv (or {split}/in-header.tsv)
    {data_dir}/{split}/in.tsv.xz    one document per line, tab-separated: filename, keys, then four
                                    text layers: text_djvu, text_tesseract, text_textract, text_best
    {data_dir}/{split}/expected.tsv one line per document: space-separated `key=value` pairs, spaces
                                    in values written `_`; a key may repeat (party); absent for
                                    unlabelled splits (test-A)

Splits: `train`, `dev-0` (and `test-A` without answers). Text cells are escaped as in GEval: `\\n`
newline, `\\t` tab, `\\f` page break, `\\\\` backslash; an unknown escape is kept as written. Page breaks
become newlines. The text comes from `text_best` (the layer the dataset authors selected per
document: the PDF's own text when it has one, else the best OCR); when that cell is empty the next
non-empty of text_textract, text_djvu, text_tesseract is used. Pass `layer=` to pick another.

Documents are read one line at a time from the xz stream, so memory stays at one document.
Fields: party (several), jurisdiction, effective_date, term; ids are the PDF names without `.pdf`.
"""

from __future__ import annotations

import lzma
import re
from collections.abc import Iterator
from pathlib import Path

from pipkie.data.errors import DataError
from pipkie.io.document import Document

LAYERS = ("text_best", "text_textract", "text_djvu", "text_tesseract")
_ESCAPES = {"n": "\n", "t": "\t", "f": "\n", "r": "\r", "\\": "\\"}
_ESCAPE_RE = re.compile(r"\\(.)", re.DOTALL)


def unescape(cell: str) -> str:
    """Undo GEval's TSV escaping (\\n, \\t, \\f page break -> newline, \\\\); keep unknown escapes."""
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), cell)


def parse_expected(line: str) -> dict[str, list[str]]:
    """`party=Nike_Inc. jurisdiction=Oregon` -> {"party": ["Nike Inc."], "jurisdiction": ["Oregon"]}."""
    fields: dict[str, list[str]] = {}
    for item in line.split():
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected key=value, got {item!r}")
        value = value.replace("_", " ").strip()
        if value:
            fields.setdefault(key, []).append(value)
    return fields


def _header(root: Path, split: str) -> tuple[list[str], Path]:
    for path in (root / split / "in-header.tsv", root / "in-header.tsv"):
        if path.is_file():
            names = path.read_text(encoding="utf-8").rstrip("\r\n").split("\t")
            return [n.strip() for n in names], path
    raise DataError(root / "in-header.tsv", "no column header (looked in the dataset root and the split)")


def read_kleister_nda(
    data_dir: str | Path,
    split: str = "train",
    limit: int | None = None,
    layer: str = "text_best",
) -> Iterator[Document]:
    """Yield the split's contracts in file order, text-only (`Document.text`), with their fields."""
    root = Path(data_dir)
    in_path = root / split / "in.tsv.xz"
    if not in_path.is_file():
        raise DataError(in_path, "no such file (expected Kleister's {split}/in.tsv.xz)")
    columns, header_path = _header(root, split)
    if "filename" not in columns:
        raise DataError(header_path, f"no `filename` column in {columns}", line=1)
    if layer not in columns:
        raise DataError(header_path, f"no text layer {layer!r} in {columns}", line=1)
    order = [layer] + [c for c in LAYERS if c != layer and c in columns]
    exp_path = root / split / "expected.tsv"
    expected = open(exp_path, encoding="utf-8", newline="\n") if exp_path.is_file() else None
    i = 0
    try:
        with lzma.open(in_path, "rt", encoding="utf-8", newline="\n") as f:
            for i, line in enumerate(f, 1):
                if limit is not None and i > limit:
                    return
                cells = line.rstrip("\n").rstrip("\r").split("\t")
                if len(cells) != len(columns):
                    raise DataError(in_path, f"{len(cells)} columns, header {header_path} has {len(columns)}", line=i)
                row = dict(zip(columns, cells))
                text = next((row[c] for c in order if row[c].strip()), "")
                fields: dict[str, list[str]] = {}
                if expected is not None:
                    exp_line = expected.readline()
                    if not exp_line:
                        raise DataError(exp_path, f"ends before in.tsv.xz (which has line {i})", line=i)
                    try:
                        fields = parse_expected(exp_line)
                    except ValueError as e:
                        raise DataError(exp_path, str(e), line=i) from None
                name = row["filename"].strip()
                yield Document(id=name.removesuffix(".pdf"), fields=fields, text=unescape(text))
            if expected is not None and limit is None and expected.readline().strip():
                raise DataError(exp_path, "has more lines than in.tsv.xz", line=i + 1)
    except (lzma.LZMAError, EOFError, UnicodeDecodeError) as e:
        raise DataError(in_path, f"cannot decompress/decode ({e})") from e
    finally:
        if expected is not None:
            expected.close()
