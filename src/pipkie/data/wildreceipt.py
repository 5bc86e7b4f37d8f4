"""WildReceipt in the mmocr KIE format: `{split}.txt` + `class_list.txt` (+ images).

`{split}.txt` holds one JSON object per line (one receipt):

    {"file_name": "image_files/Image_16/11/receipt_0.jpeg", "height": 1000, "width": 747,
     "annotations": [{"box": [x1, y1, x2, y2, x3, y3, x4, y4], "text": "...", "label": 23}, ...]}

Boxes are pixel quadrilaterals (corner order varies; only their extent is used). `class_list.txt`
maps label ids to class names by line order (0 = Ignore, 1 = Store_name_value, ... 26 classes);
a line may also be written `id name`, in which case the id is taken from the line.

Fields: every `*_value` class becomes a key, its name lower-cased without `_value`
(`Store_name_value` -> `store_name`). Several boxes of one class are joined with spaces in reading
order (`pipkie.io.reading_order`, grouped as every result was scored: `AS_SCORED`) into one value (a
line repeated verbatim, such as a total printed twice, is kept once), except the per-product classes in
`multi_valued` (`prod_item`, `prod_quantity`, `prod_price` by default), which keep one value per
visual line, in reading order. With `keys="sroie"` only the four SROIE fields are emitted, renamed by
`SROIE_KEYS`. Document ids are the image path without `image_files/` and extension, `/` -> `_`.

Line items (`keys="all"`): the product classes also become the parallel fields `items.name`,
`items.quantity`, `items.price` of `pipkie.data.receipts` ("" where a line has no such box), one
item per visual line of product boxes (`items_of`), so that `items[name, quantity, price]` can be
trained and scored on WildReceipt.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from pipkie.data.errors import DataError
from pipkie.io.document import Document, Word, normalize_box
from pipkie.io.reading_order import AS_SCORED, reading_order_lines

# WildReceipt class -> SROIE key. WildReceipt has no single "company" class: the store name is the
# closest match (receipts rarely print the legal company name separately).
SROIE_KEYS = {
    "Store_name_value": "company",
    "Store_addr_value": "address",
    "Date_value": "date",
    "Total_value": "total",
}
MULTI_VALUED = ("prod_item", "prod_quantity", "prod_price")
ITEM_CLASSES = {"prod_item": "name", "prod_quantity": "quantity", "prod_price": "price"}


def items_of(by_key: dict[str, list[Word]]) -> list[dict[str, str]]:
    """Line items from the product boxes: the visual lines (`reading_order_lines`) of every
    prod_item / prod_quantity / prod_price box, one item per line, each class's boxes on the line
    joined by spaces. A line with a price but no name after a line with a name but no price is the
    second line of that item (`Name` / `2 @ 3.00   6.00`); a line with a quantity alone goes with the
    next line."""
    words = [(w, field) for key, field in ITEM_CLASSES.items() for w in by_key.get(key, [])]
    if not words:
        return []
    field_of = {id(w): f for w, f in words}
    items: list[dict[str, str]] = []
    carry: dict[str, list[str]] = {}
    for line in reading_order_lines([w for w, _ in words], **AS_SCORED):
        parts = dict(carry)
        carry = {}
        for w in line:
            parts.setdefault(field_of[id(w)], []).append(w.text)
        item = {f: " ".join(parts.get(f, [])) for f in ITEM_CLASSES.values()}
        if not item["name"] and not item["price"]:
            carry = parts  # a quantity alone: the next line's
            continue
        last = items[-1] if items else None
        if (
            last
            and not item["name"]
            and last["name"]
            and not last["price"]
            and not (item["quantity"] and last["quantity"])
        ):
            last["price"] = item["price"]
            last["quantity"] = last["quantity"] or item["quantity"]
            continue
        items.append(item)
    if carry:
        items.append({f: " ".join(carry.get(f, [])) for f in ITEM_CLASSES.values()})
    return items


def read_class_list(path: Path) -> dict[int, str]:
    """Label id -> class name; lines are `name` (id = line index from 0) or `id name`."""
    if not path.is_file():
        raise DataError(path, "no class list (expected mmocr's class_list.txt next to the split file)")
    classes: dict[int, str] = {}
    for i, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        parts = line.strip().split(maxsplit=1)
        if not parts:
            continue
        if len(parts) == 2 and parts[0].isdigit():
            classes[int(parts[0])] = parts[1].strip()
        elif len(parts) == 1:
            classes[i - 1] = parts[0]
        else:
            raise DataError(path, f"expected `name` or `id name`, got {line.strip()!r}", line=i)
    return classes


def _key_of(class_name: str, keys: str) -> str | None:
    if keys == "sroie":
        return SROIE_KEYS.get(class_name)
    if class_name.lower().endswith("_value"):
        return class_name[: -len("_value")].lower()
    return None


def _parse_record(rec: dict, classes: dict[int, str], keys: str, multi_valued) -> tuple:
    """(words, page size, fields) of one JSON record; raises KeyError/TypeError/ValueError if malformed."""
    width, height = float(rec["width"]), float(rec["height"])
    if width <= 0 or height <= 0:
        raise ValueError(f"bad page size {width}x{height}")
    words: list[Word] = []
    by_key: dict[str, list[Word]] = {}
    for ann in rec["annotations"]:
        box = [float(v) for v in ann["box"]]
        if len(box) < 4 or len(box) % 2:
            raise ValueError(f"box must have an even number (>= 4) of coordinates, got {len(box)}")
        label = int(ann["label"])
        if label not in classes:
            raise ValueError(f"label {label} is not in class_list.txt")
        text = str(ann["text"]).strip()
        if not text:
            continue
        word = Word(text, normalize_box(box, width, height))
        words.append(word)
        key = _key_of(classes[label], keys)
        if key is not None:
            by_key.setdefault(key, []).append(word)
    fields: dict[str, list[str]] = {}
    for key, ws in by_key.items():
        lines = [" ".join(w.text for w in line) for line in reading_order_lines(ws, **AS_SCORED)]
        # A value printed twice (a date in the header and the footer) is kept once.
        fields[key] = lines if key in multi_valued else [" ".join(dict.fromkeys(lines))]
    items = items_of(by_key) if keys == "all" else []
    for f in ITEM_CLASSES.values() if items else ():
        fields[f"items.{f}"] = [it[f] for it in items]
    return words, (int(width), int(height)), fields


def doc_id(file_name: str) -> str:
    stem = file_name.removeprefix("image_files/").rsplit(".", 1)[0]
    return stem.replace("/", "_").replace("\\", "_")


def read_wildreceipt(
    data_dir: str | Path,
    split: str = "test",
    limit: int | None = None,
    keys: str = "all",
    multi_valued: tuple[str, ...] = MULTI_VALUED,
) -> Iterator[Document]:
    """Yield the split's receipts in file order. keys: "all" (every `*_value` class) or "sroie"."""
    if keys not in ("all", "sroie"):
        raise ValueError(f"keys must be 'all' or 'sroie', not {keys!r}")
    root = Path(data_dir)
    ann_path = root / f"{split}.txt"
    if not ann_path.is_file():
        raise DataError(ann_path, "no such file (expected mmocr KIE's {split}.txt)")
    classes = read_class_list(root / "class_list.txt")
    n = 0
    with open(ann_path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            if limit is not None and n >= limit:
                return
            try:
                rec = json.loads(line)
                words, size, fields = _parse_record(rec, classes, keys, multi_valued)
                file_name = str(rec["file_name"])
            except json.JSONDecodeError as e:
                raise DataError(ann_path, f"not JSON ({e.msg})", line=i) from e
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                raise DataError(ann_path, f"bad receipt record ({type(e).__name__}: {e})", line=i) from e
            image = root / file_name
            yield Document(
                id=doc_id(file_name),
                words=words,
                page_sizes=[size],
                fields=fields,
                images=[str(image)] if image.exists() else [],
            )
            n += 1
