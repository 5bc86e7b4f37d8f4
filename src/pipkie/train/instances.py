"""Training instances for the three objectives, built with the same TemplateBuilder as inference.

An `Instance` is one row of a batch: ids, explicit positions, block ids (0 = causal prefix,
k > 0 = answer block k) and the (position -> target) pairs that carry the loss.

- KV-SFT (`pip`): the document prefix, then `templates_per_doc` answer blocks, each a random
  order and subset of the keys (plus, sometimes, an absent key answering `unknown`), each
  positioned right after the prefix and isolated from the other blocks, so every block is trained
  exactly as it is decoded. With probability `reveal` part of a block's answer is shown in place
  of its masks (the situation of a refinement pass). A template with a list of items
  (`pipkie.model.groups`) brings its chain of group blocks; the chains of two templates are kept apart
  by an unused block id between them.
- AR baseline (`ar`): the same document and the same templates, each block being the key list,
  `<|pip_answer|>` and the answer written out causally (items in the same layout as PIP's).
- Stage 1 (`mask`): the document's tail becomes a block whose tokens are masked at a ratio drawn
  per sample (masked-diffusion style) and reconstructed, attending to the causal head of the
  document and bidirectionally within the block.
- Stage 1 (`copy`): KIE-shaped blocks made from any text: the "key" is a few words of the
  document and the "value" the span that follows them, so the model learns to find a place in the
  document and copy a run of tokens in one pass, with unlimited supervision.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch

from pipkie.model.attention import GROUP_BLOCK
from pipkie.model.copyhead import FieldSpan
from pipkie.model.template import IGNORE, TemplateBuilder
from pipkie.schema import Key, KeySchema

# Keys no receipt or form in our data has: trained to answer `unknown`.
ABSENT_KEYS = (
    "passport_number",
    "flight_number",
    "vehicle_plate",
    "patient_name",
    "iban",
    "policy_number",
    "blood_type",
    "course_code",
    "shipping_container",
    "vin",
)


@dataclass(frozen=True)
class FieldTarget:
    """One field of an instance, as the copy head's loss needs it."""

    slots: list[int]  # the field's slot positions in the instance
    may_be_absent: bool = True  # flat keys may answer `unknown`; list items may not
    span: int = 0  # span fields: the value's budget when it is longer than the slots (FieldSlots.span)
    value: list[int] | None = None  # ... and the value's whole tokens (FieldSlots.value)


@dataclass
class Instance:
    ids: list[int]
    pos: list[int]
    block: list[int]
    targets: list[int]  # IGNORE where no loss
    # copy head (builder.copy): the fields, and the document's copy stream
    fields: list[FieldTarget] = field(default_factory=list)
    stream: list[int] = field(default_factory=list)


def random_schemas(keys: list[str], rng: random.Random, n: int, key_dropout: float, absent: float) -> list[KeySchema]:
    out = []
    for _ in range(n):
        chosen = [k for k in keys if rng.random() >= key_dropout] or [rng.choice(keys)]
        if rng.random() < absent:
            chosen.append(rng.choice(ABSENT_KEYS))
        rng.shuffle(chosen)
        out.append(KeySchema(tuple(Key(k) for k in chosen)))
    return out


def kv_instance(
    builder: TemplateBuilder,
    text: str,
    values: dict,
    schemas: list[KeySchema],
    *,
    objective: str,
    rng: random.Random,
    reveal: float = 0.0,
) -> Instance:
    """Document prefix + one answer block per schema (PIP masks or AR answers)."""
    reserved = max((builder.template_length(s) if objective == "pip" else builder.ar_reserved(s)) for s in schemas)
    fit = builder.fit(text, reserved, answer=objective == "pip")
    prefix, n = fit.ids, len(fit.ids)
    inst = Instance(list(prefix), list(range(n)), [0] * n, [IGNORE] * n)
    if builder.copy and objective == "pip":  # (never from the cut marker of a document cut to fit)
        inst.stream = builder.copy_stream(prefix, *builder.document_span(n), seam=fit.seam)
    next_block, next_group = 1, 0  # flat blocks count from 1, group blocks from GROUP_BLOCK + 1
    for _b, schema in enumerate(schemas, start=1):
        if objective == "pip":
            ids, slots, targets, blocks = builder.pip_block(schema, values, offset=len(inst.ids))
            blocks = [x + next_group if x > GROUP_BLOCK else next_block - 1 + x for x in blocks]
            if builder.copy:  # the copy loss needs every slot's target: nothing is revealed
                inst.fields += [
                    FieldTarget(list(range(f.start, f.start + f.length)), f.may_be_absent, f.span, f.value)
                    for f in slots
                ]
            elif rng.random() < reveal:
                ratio = rng.random()
                for i, t in enumerate(targets):
                    if t != IGNORE and rng.random() < ratio:
                        ids[i], targets[i] = t, IGNORE  # shown, not predicted
        else:  # key list + <|pip_answer|> + answer, a causal block of its own
            head = builder.key_list(schema) + [builder.answer_id]
            answer = builder.ar_answer(schema, values)
            ids = head + answer
            targets = [IGNORE] * (len(head) - 1) + answer + [IGNORE]
            blocks = [next_block] * len(ids)
        inst.ids += ids
        inst.pos += list(range(n, n + len(ids)))
        inst.block += blocks
        flat, chain = [x for x in blocks if x <= GROUP_BLOCK], [x for x in blocks if x > GROUP_BLOCK]
        next_block = max(flat) + 1 if flat else next_block
        next_group = max(chain) + 1 - GROUP_BLOCK if chain else next_group  # one unused id before the next chain
        inst.targets += targets
    return inst


def mask_instance(
    builder: TemplateBuilder, text: str, *, rng: random.Random, ratio: tuple[float, float], max_block: int = 128
) -> Instance:
    """Stage 1: reconstruct a masked tail of the document from its causal head."""
    ids = builder.instruction_ids + builder.document_ids(text)[: builder.max_length - len(builder.instruction_ids) - 1]
    tail = min(max_block, max(4, len(ids) // 3))
    cut = max(len(builder.instruction_ids) + 1, len(ids) - tail)
    head, block = ids[:cut] + [builder.answer_id], ids[cut:]
    r = rng.uniform(*ratio)
    masked = [rng.random() < r for _ in block] or [True]
    if not any(masked):
        masked[rng.randrange(len(block))] = True
    n = len(head)
    return Instance(
        ids=head + [builder.mask_id if m else t for t, m in zip(block, masked)],
        pos=list(range(n + len(block))),
        block=[0] * n + [1] * len(block),
        targets=[IGNORE] * n + [t if m else IGNORE for t, m in zip(block, masked)],
    )


def copy_instance(
    builder: TemplateBuilder,
    text: str,
    *,
    rng: random.Random,
    blocks: int = 4,
    key_words: tuple[int, int] = (1, 4),
    max_value: int = 24,
) -> Instance:
    """Stage 1, span copy: `"\\n" <words before the span> ":"` + slots → the span's tokens."""
    words = text.split()
    spans = []
    for _ in range(blocks):
        if len(words) < 3:
            break
        k = rng.randint(*key_words)
        i = rng.randrange(1, max(2, len(words) - 1))
        key = " ".join(words[max(0, i - k) : i]).replace(":", " ")
        value = " ".join(words[i : i + rng.randint(1, 8)])
        spans.append((key[:60] or "start", value))
    values = {f"k{j}": v for j, (_, v) in enumerate(spans)}
    budget = max([len(builder.value_ids(v, max_value)) + 1 for v in values.values()] + [2])
    fit = builder.fit(text, reserved=len(spans) * (budget + 24))
    prefix, n = fit.ids, len(fit.ids)
    inst = Instance(list(prefix), list(range(n)), [0] * n, [IGNORE] * n)
    if builder.copy:
        inst.stream = builder.copy_stream(prefix, *builder.document_span(n), seam=fit.seam)
    for j, (key, value) in enumerate(spans, start=1):
        header = builder._ids(f"\n{key}:")
        v = builder.value_ids(value, budget)
        if builder.copy:
            start = len(inst.ids) + len(header)
            # (may be absent, and never is: the absent score learns to stay low)
            inst.fields.append(FieldTarget(list(range(start, start + budget))))
        ids = header + [builder.slot_input(t) for t in range(budget)]
        targets = [IGNORE] * len(header) + v + [builder.end_id] * (budget - len(v))
        inst.ids += ids
        inst.pos += list(range(n, n + len(ids)))
        inst.block += [j] * len(ids)
        inst.targets += targets
    return inst


def padded_width(length: int, multiple: int = 64) -> int:
    """`length` rounded up to a multiple of `multiple` (the width of a padded batch)."""
    return -(-length // multiple) * multiple


def collate(instances: list[Instance], builder: TemplateBuilder, *, absent: bool = True, multiple: int = 64) -> dict:
    """Right-padded batch tensors; `keep` marks the positions whose logits are computed.

    The builder gives the pad, end and `unknown` tokens; `absent`: the copy loss also trains the
    absent score on the fields that may be absent (off: the copy loss of heads without one).

    The width is rounded up to a multiple of `multiple`: a handful of distinct shapes instead of
    one per batch keeps the CPU kernels' per-shape caches (and the process's memory) bounded."""
    width = padded_width(max(len(x.ids) for x in instances), multiple)
    B = len(instances)
    ids = torch.full((B, width), builder.pad_id, dtype=torch.long)
    pos = torch.zeros((B, width), dtype=torch.long)
    block = torch.zeros((B, width), dtype=torch.long)
    attn = torch.zeros((B, width), dtype=torch.long)
    tgt = torch.full((B, width), IGNORE, dtype=torch.long)
    for i, x in enumerate(instances):
        n = len(x.ids)
        ids[i, :n], pos[i, :n], block[i, :n] = torch.tensor(x.ids), torch.tensor(x.pos), torch.tensor(x.block)
        attn[i, :n] = 1
        tgt[i, :n] = torch.tensor(x.targets)
    keep = tgt != IGNORE
    batch = dict(input_ids=ids, position_ids=pos, block_ids=block, attention_mask=attn, keep=keep, targets=tgt[keep])
    if any(x.fields for x in instances):
        batch["copy_fields"] = [
            FieldSpan(
                row=i,
                slots=torch.tensor(f.slots),
                stream=torch.tensor(x.stream),
                end_id=builder.end_id,
                stream_ids=torch.tensor([x.ids[p] for p in x.stream]),
                targets=torch.tensor([x.targets[p] for p in f.slots]),
                absent_id=builder.unknown_id if absent and f.may_be_absent else -1,
                span=f.span,
                value=None if f.value is None else torch.tensor(f.value),
            )
            for i, x in enumerate(instances)
            for f in x.fields
        ]
    return batch
