"""What a decoder returns: a value per field (`FieldResult`), and slot tokens turned into them.

Shared by every decoder: PIP's slots (`collect`, lists gathered by `pipkie.model.groups`) and AR's
generated tokens (`field_result`) give values and confidences the same way (the geometric mean of
the value's token probabilities, its end token included).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from pipkie.model.groups import collect as collect_items
from pipkie.model.template import TemplateBuilder
from pipkie.schema import KeySchema


@dataclass
class FieldResult:
    value: str | None
    confidence: float
    tokens: list[int] = field(default_factory=list)
    truncated: bool = False  # the value filled its budget: no end token predicted inside it
    withheld: str | None = None  # the value read, answered `unknown` below its key's threshold (decoding.abstain)
    layout: bool = False  # read off a skipped line by its neighbours' layout, not decoded (decoding.gaps)


Prediction = dict[str, FieldResult]


def geo_mean(probs: list[float]) -> float:
    if not probs:
        return 0.0
    return float(torch.tensor(probs).clamp_min(1e-12).log().mean().exp())


def field_result(builder: TemplateBuilder, toks: list[int], probs: list[float]) -> FieldResult:
    """A value's slots (or generated tokens) → its result; no end token among them: `truncated`."""
    end = next((i for i, t in enumerate(toks) if t == builder.end_id), None)
    n = len(toks) if end is None else end + 1  # value + its end token
    value = builder.decode_value(toks)
    return FieldResult(value, geo_mean(probs[:n]), toks[:n], truncated=end is None and value is not None)


def collect(
    builder, encs, toks: list[int], conf: list[float], schemas: list[KeySchema] | None = None
) -> list[Prediction]:
    """Slot tokens -> each document's results; a list's fields are gathered into its ItemsResult
    (an item whose first field's first slot says `<|pip_end|>` ends the list: `pipkie.model.groups`).
    `schemas` (one per document) is needed when they have lists."""
    out, i = [], 0
    for r, e in enumerate(encs):
        groups = schemas[r].groups if schemas else ()
        pred, lists = {}, {g.name: [] for g in groups}
        first = {g.name: g.fields[0].name for g in groups}
        for f in e.fields:
            result = field_result(builder, toks[i : i + f.width], conf[i : i + f.width])
            if f.group is None:
                pred[f.key] = result
            else:
                stop = f.field == first[f.group] and toks[i] == builder.end_id
                lists[f.group].append((f.item, f.field, result, stop))
            i += f.width
        if groups:
            for g in groups:
                pred[g.name] = collect_items(g, lists[g.name], lambda: FieldResult(None, 0.0))
        out.append(pred)
    return out
