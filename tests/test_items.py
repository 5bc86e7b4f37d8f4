"""Lists of items (pipkie.model.groups): schemas, the group template, its attention, one-pass decoding, AR."""

import json
import random

import pytest
import torch
from pydantic import BaseModel, Field

from pipkie.decoding.pip import pip_decode
from pipkie.decoding.results import FieldResult
from pipkie.decoding.results import collect as _collect
from pipkie.model.attention import GROUP_BLOCK, build_attention_mask
from pipkie.model.groups import ItemsResult, collect, items_budgets
from pipkie.model.template import TemplateBuilder
from pipkie.schema import Group, Key, KeySchema, SchemaError
from pipkie.train.instances import collate, kv_instance
from tests.conftest import tiny_model

DOC = "apple store\nberry 3/1\ncedar 12/4\ntotal 15/5"
ITEMS = [{"name": "berry", "price": "3/1"}, {"name": "cedar", "price": None}]


# ---- schemas -----------------------------------------------------------------------------------
def test_shorthand_json_schema_and_pydantic_agree(tmp_path):
    class Item(BaseModel):
        name: str = Field(description="the product")
        quantity: str | None = None
        price: str = Field(max_length=10)

    class Receipt(BaseModel):
        company: str
        total: str | None = None
        items: list[Item] = Field(max_length=30)

    from_model = KeySchema.parse(Receipt)
    assert from_model.names == ["company", "total"] and from_model.group_names == ["items"]
    (g,) = from_model.groups
    assert g.names == ["name", "quantity", "price"] and g.max_items == 30
    assert g.fields[0].description == "the product" and g.fields[2].max_chars == 10
    short = KeySchema.parse("company, total, items[name, quantity,price]")
    assert short.names == from_model.names and short.groups[0].names == g.names and short.groups[0].max_items is None
    assert g.required == ("name", "price") and short.groups[0].required == ()  # fields without a default
    marked = KeySchema.parse("items[name!, quantity, price:money!]").groups[0]
    assert marked.required == ("name", "price") and marked.names == g.names and marked.fields[2].type == "money"
    assert marked.spec() == g.spec() == "items[name!,quantity,price!]"  # written back as the shorthand
    assert marked.spec(required=False) == "items[name,quantity,price]"
    assert KeySchema.parse(marked.spec()).groups[0].required == marked.required
    p = tmp_path / "s.json"
    p.write_text(json.dumps(Receipt.model_json_schema()))
    assert KeySchema.parse(str(p)) == from_model
    plain = {
        "properties": {
            "lines": {
                "type": ["array", "null"],
                "maxItems": 5,
                "items": {"type": "object", "properties": {"name": {"type": "string"}}},
            }
        }
    }
    assert KeySchema.parse(plain).groups == (Group("lines", (Key("name"),), 5),)
    assert len(short) == 5  # flat keys + the list's fields: what a key limit counts


@pytest.mark.parametrize(
    "spec,message",
    [
        ("items[name,price", "not closed"),
        ("items]name", "closes no"),
        ("items[]", "no fields"),
        ("[name,price]", "not a list"),
        ("items[name[x]]", "not a list"),
        ("items[name,name]", "twice"),
        ("items,items[name]", "twice"),
        ("items[to:tal]", "unknown value type .tal."),  # a field "to" of type "tal"
        ("items[to;tal]", "characters other"),
        ({"properties": {"items": {"type": "array"}}}, "needs 'items'"),
        (
            {
                "properties": {
                    "items": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "sub": {
                                    "type": "array",
                                    "items": {"type": "object", "properties": {"x": {"type": "string"}}},
                                }
                            },
                        },
                    }
                }
            },
            "one level",
        ),
        (
            {
                "properties": {
                    "items": {
                        "type": "array",
                        "maxItems": 0,
                        "items": {"type": "object", "properties": {"n": {"type": "string"}}},
                    }
                }
            },
            "maxItems",
        ),
        ({"properties": {"items": {"type": "array", "items": {"$ref": "#/$defs/Nope"}}}}, "cannot follow"),
        ({"properties": {"n": {"type": "integer"}}}, "must be a string"),
        (
            {
                "properties": {
                    "items": {
                        "type": "array",
                        "items": {"type": "object", "properties": {"n": {"type": "string"}}, "required": ["cost"]},
                    }
                }
            },
            "required field 'cost' is not one of its fields",
        ),
    ],
)
def test_list_schema_errors(spec, message):
    with pytest.raises(SchemaError, match=message):
        KeySchema.parse(spec)


# ---- template ----------------------------------------------------------------------------------
SCHEMA = KeySchema((Key("total"),), (Group("items", (Key("name"), Key("price", max_tokens=5)), 3),))


def test_group_template_layout_targets_and_blocks(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=4, field_blocks=True)
    enc = b.pip(DOC, SCHEMA, {"total": "15/5", "items": ITEMS})
    flat = b.pip(DOC, KeySchema((Key("total"),)), {"total": "15/5"})
    assert enc.input_ids[: len(flat.input_ids)] == flat.input_ids  # the flat part is the flat template
    assert [(f.key, f.group, f.item, f.field) for f in enc.fields][1:3] == [
        ("items[0].name", "items", 0, "name"),
        ("items[0].price", "items", 0, "price"),
    ]
    assert len(enc.fields) == 1 + 3 * 2
    for f in enc.fields[1:]:
        header = tokenizer.decode(
            enc.input_ids[f.start - len(b.cached_ids(f"\nitems {f.item + 1} {f.field}:")) : f.start]
        )
        assert header == f"\nitems {f.item + 1} {f.field}:"  # the item's number is in its header
        assert f.length == (5 if f.field == "price" else 16)  # its own budget, else the item default (name: 16)
    values = [b.decode_value(enc.targets[f.start : f.start + f.length]) for f in enc.fields[1:]]
    assert values == ["berry", "3/1", "cedar", None, None, None]
    c_price = enc.fields[4]  # an empty column answers `unknown`, not the end token
    assert enc.targets[c_price.start] != b.end_id
    surplus = enc.fields[5:]  # the third group: "no more items", every slot the end token
    assert all(enc.targets[f.start : f.start + f.length] == [b.end_id] * f.length for f in surplus)
    blocks = [enc.blocks[f.start - enc.prefix_len] for f in enc.fields]
    assert blocks == [1] + [GROUP_BLOCK + 1] * 2 + [GROUP_BLOCK + 2] * 2 + [GROUP_BLOCK + 3] * 2
    assert enc.prefix_len + b.template_length(SCHEMA) == len(enc.input_ids)


def test_default_item_budget_fits_the_context(tokenizer):
    schema = KeySchema.parse("total,items[name,quantity,price]")
    small, large = (TemplateBuilder(tokenizer, max_length=n, default_budget=4) for n in (512, 8192))
    assert items_budgets(large, schema) == [24]  # DEFAULT_ITEMS when there is room
    k = items_budgets(small, schema)[0]
    assert 1 <= k < 24 and small.template_length(schema) <= 256 < small.template_length(
        KeySchema(schema.keys, (Group("items", schema.groups[0].fields, k + 1),))
    )


def test_ar_answer_writes_items_and_the_stop(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=6)
    enc = b.ar(DOC, SCHEMA, {"total": "15/5", "items": ITEMS})
    answer = tokenizer.decode(enc.input_ids[enc.prefix_len :]).replace(" ", "")
    assert answer == (
        "\ntotal:15/5<|pip_end|>\nitems1name:berry<|pip_end|>\nitems1price:3/1<|pip_end|>"
        "\nitems2name:cedar<|pip_end|>\nitems2price:unknown<|pip_end|>\nitems3name:<|pip_end|>" + tokenizer.eos_token
    )
    assert "items[name, price]" in tokenizer.decode(b.key_list(SCHEMA))
    full = b.ar(DOC, SCHEMA, {"total": "1/1", "items": ITEMS + ITEMS})  # 4 items, 3 fit: no stop header
    assert "items 4" not in tokenizer.decode(full.input_ids) and len(full.input_ids) - full.prefix_len <= b.ar_reserved(
        SCHEMA
    )


def test_first_item_headers_name_the_item_once(tokenizer):
    """item_headers="first": an item's later fields are headed by their name alone; the slots, their
    targets and blocks are those of "each", and the template is shorter by the item headers saved."""
    each = TemplateBuilder(tokenizer, max_length=256, default_budget=4, field_blocks=True)
    first = TemplateBuilder(
        tokenizer, max_length=256, default_budget=4, field_blocks=True, item_headers="first", item_budgets={"name": 3}
    )
    values = {"total": "15/5", "items": ITEMS}
    a, b = each.pip(DOC, SCHEMA, values), first.pip(DOC, SCHEMA, values)
    for f in b.fields[1:]:
        head = f"\nitems {f.item + 1} {f.field}:" if f.field == "name" else f" {f.field}:"
        assert tokenizer.decode(b.input_ids[f.start - len(first.cached_ids(head)) : f.start]) == head
        assert f.length == {"name": 3, "price": 5}[f.field]  # item_budgets by name; price keeps its own
    assert [first.decode_value(b.targets[f.start : f.start + f.length]) for f in b.fields[1:]] == [
        "berry", "3/1", "cedar", None, None, None,
    ]  # fmt: skip
    saved = sum(len(each.cached_ids(f"\nitems {i} price:")) - len(first.cached_ids(" price:")) for i in (1, 2, 3))
    assert len(a.input_ids) - len(b.input_ids) == saved + 3 * (16 - 3)  # headers + the name slots
    assert first.template_length(SCHEMA) == len(b.input_ids) - b.prefix_len
    with pytest.raises(ValueError, match="item_headers must be one of each, first"):
        TemplateBuilder(tokenizer, item_headers="every")


def test_first_item_headers_ar_answer_parses_back(tokenizer):
    """The AR baseline writes "first" headers the same way, and its free answer is read back."""
    from pipkie.decoding.ar import parse_free_answer

    b = TemplateBuilder(tokenizer, max_length=256, default_budget=6, item_headers="first")
    enc = b.ar(DOC, SCHEMA, {"total": "15/5", "items": ITEMS})
    answer = enc.input_ids[enc.prefix_len :]
    assert tokenizer.decode(answer).replace(" ", "") == (
        "\ntotal:15/5<|pip_end|>\nitems1name:berry<|pip_end|>price:3/1<|pip_end|>"
        "\nitems2name:cedar<|pip_end|>price:unknown<|pip_end|>\nitems3name:<|pip_end|>" + tokenizer.eos_token
    )
    assert len(answer) <= b.ar_reserved(SCHEMA)
    out = parse_free_answer(b, answer, [0.5] * len(answer), ["total"], SCHEMA)
    assert out["total"].value == "15/5" and not out["items"].truncated
    assert out["items"].value == ITEMS
    stray = tokenizer(" price: 9/9<|pip_end|>\ntotal: 1/1<|pip_end|>", add_special_tokens=False)["input_ids"]
    assert parse_free_answer(b, stray, [0.5] * len(stray), ["total"], SCHEMA)["items"].value == []  # no item yet


def test_item_headers_are_a_saved_setting(tmp_path, tokenizer):
    from pipkie.model.modeling import Settings, builder_for

    Settings(item_headers="first", item_budgets={"name": 10}).save(tmp_path)
    b = builder_for(tokenizer, Settings.load(tmp_path))
    assert (b.item_headers, b.item_budgets) == ("first", {"name": 10})
    assert builder_for(tokenizer, Settings()).item_headers == "each"  # models up to round 5


# ---- attention ---------------------------------------------------------------------------------
def test_group_attention_sees_document_itself_and_previous_group_only(tokenizer):
    """Packed after one document: a flat template, then two item templates. Item i attends to the
    document, to itself (both ways) and to item i - 1 of its own template, nothing else."""
    b = TemplateBuilder(tokenizer, max_length=512, default_budget=3, field_blocks=True)
    model = tiny_model(tokenizer)
    schema = KeySchema((Key("total"),), (Group("items", (Key("name", max_tokens=2), Key("price", max_tokens=2)), 3),))
    inst = kv_instance(
        b,
        DOC,
        {"total": "15/5", "items": ITEMS},
        [KeySchema.parse("total"), schema, schema],
        objective="pip",
        rng=random.Random(0),
    )
    batch = collate([inst], b, absent=False)
    m = build_attention_mask(
        model,
        "prefix_causal",
        batch["attention_mask"],
        query_length=batch["input_ids"].shape[1],
        block_ids=batch["block_ids"],
        position_ids=batch["position_ids"],
    )
    m = (m[0, 0] if m.dtype == torch.bool else m[0, 0] == 0)[: len(inst.ids), : len(inst.ids)]
    block = torch.tensor(inst.block)
    chains = sorted({int(x) for x in block if x > GROUP_BLOCK})
    assert len(chains) == 6 and chains[3] - chains[2] == 2  # two chains of 3, an unused id between them
    for q in range(len(inst.ids)):
        bq = int(block[q])
        if bq <= GROUP_BLOCK:
            continue
        allowed = (block == 0) | (block == bq) | ((block == bq - 1) & (bq - 1 > GROUP_BLOCK))
        assert torch.equal(m[q], allowed), f"row {q} (block {bq - GROUP_BLOCK})"
    first_of_second_chain = (block == chains[3]).nonzero()[0, 0]
    assert not m[first_of_second_chain][block == chains[2]].any()  # no template's first item sees another's last
    later = (block == chains[1]).nonzero()[:, 0]
    assert not m[(block == chains[0]).nonzero()[:, 0]][:, later].any()  # item 1 never sees item 2
    flat_row = (block == 1).nonzero()[0, 0]
    assert not m[flat_row][block > GROUP_BLOCK].any()


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_group_mask_equals_transformers_vmap_path(tokenizer, attn):
    from transformers.masking_utils import create_causal_mask

    from pipkie.model.attention import extra_pattern, isolated_template_blocks

    model = tiny_model(tokenizer, attn=attn)
    g = GROUP_BLOCK
    block = torch.tensor(
        [[0, 0, 0, 1, 1, g + 1, g + 1, g + 2, g + 2, g + 3], [0, 0, g + 1, g + 2, g + 2, g + 4, g + 5, 0, 0, 0]]
    )
    attn_mask = torch.tensor([[1] * 10, [1] * 7 + [0] * 3])
    pos = attn_mask.cumsum(-1) - 1
    ours = build_attention_mask(model, "prefix_causal", attn_mask, query_length=10, block_ids=block, position_ids=pos)
    probe = torch.empty(2, 10, 1, dtype=model.dtype)
    ref = create_causal_mask(
        config=model.config,
        inputs_embeds=probe,
        attention_mask=attn_mask,
        cache=None,
        position_ids=pos,
        or_mask_function=extra_pattern("prefix_causal", block),
        and_mask_function=isolated_template_blocks(block),
        allow_is_causal_skip=False,
    )
    assert torch.equal(ours, ref)
    seen = ours[1, 0] if ours.dtype == torch.bool else ours[1, 0] == 0
    assert seen[3, 2] and not seen[2, 3] and not seen[5, 4] and seen[6, 5]  # g+4 is a chain's first


# ---- decoding ----------------------------------------------------------------------------------
def test_one_forward_pass_whatever_the_number_of_items(tokenizer):
    """PIP decodes a batch of receipts of 1 and 9 item lines with 12 item groups in ONE forward pass
    of the model (its decoder counted), and every document gets its list."""
    from pipkie.model.copyhead import CopyHead, attach

    model = tiny_model(tokenizer, slot_tokens=4)
    attach(model, CopyHead(model.config.hidden_size, 16))
    b = TemplateBuilder(tokenizer, max_length=1024, default_budget=3, slot_tokens=4, field_blocks=True, copy=True)
    schema = KeySchema.parse("total,items[name,price]")
    schema = KeySchema(schema.keys, (Group("items", schema.groups[0].fields, 12),))
    calls = []
    decoder = model.model
    hook = decoder.register_forward_hook(lambda *a: calls.append(1))
    try:
        for n in (1, 9):
            texts = ["\n".join(f"berry {i}/{i}" for i in range(n)), "\n".join(f"cedar {i}/1" for i in range(n))]
            calls.clear()
            out = pip_decode(model, b, texts, [schema] * 2)
            assert len(calls) == 1, f"{n} lines: {len(calls)} forward passes"
            assert all(isinstance(p["items"], ItemsResult) and len(p["items"].items) <= 12 for p in out)
    finally:
        hook.remove()


def test_a_list_gets_at_most_one_group_more_than_the_document_has_lines(tokenizer, monkeypatch):
    """K = min(budget, lines + 1) per document, for every decoder (`within_lines`, applied by
    `Decoder.__call__`): a 3-line receipt's pass holds 4 groups, not 12, and a long one keeps 12."""
    from pipkie.decoding import get_decoder
    from pipkie.model.groups import within_lines

    b = TemplateBuilder(tokenizer, max_length=1024, default_budget=3)
    schema = KeySchema.parse("total,items[name,price]")
    schema = KeySchema(schema.keys, (Group("items", schema.groups[0].fields, 12),))
    short, long = "a 1\nb 2\nc 3", "\n".join(f"x {i}" for i in range(30))
    assert items_budgets(b, within_lines(b, schema, short)) == [4]
    assert within_lines(b, schema, long) is schema
    assert within_lines(b, KeySchema.parse("total"), short) == KeySchema.parse("total")
    dec = get_decoder("pip")
    seen = []
    fake = lambda self, model, builder, texts, schemas, **kw: seen.extend(schemas) or [{} for _ in texts]  # noqa: E731
    monkeypatch.setattr(type(dec), "decode", fake)
    dec(None, b, [short, long], [schema, schema])
    assert [items_budgets(b, s) for s in seen] == [[4], [12]]
    assert len(dec.encode(b, short, seen[0]).input_ids) < len(dec.encode(b, short, schema).input_ids)


def test_collect_stops_at_the_first_group_that_says_no_more(tokenizer):
    b = TemplateBuilder(tokenizer, default_budget=3)
    g = Group("items", (Key("name"), Key("price")))
    berry, price, end, unk = b.value_ids("berry", 5), b.value_ids("3/1", 5), [b.end_id], b.value_ids(None, 5)
    rows = [
        (0, "name", berry, False),
        (0, "price", price, False),
        (1, "name", unk, False),
        (1, "price", unk, False),
        (2, "name", end, True),
        (2, "price", price, False),
        (3, "name", berry, False),
    ]
    out = collect(
        g,
        [(i, f, FieldResult(b.decode_value(t), 0.5, t), stop) for i, f, t, stop in rows],
        lambda: FieldResult(None, 0.0),
    )
    assert out.value == [{"name": "berry", "price": "3/1"}] and not out.truncated  # item 1 read nothing: left out
    full = collect(g, [(0, "name", FieldResult("a", 0.9), False)], lambda: FieldResult(None, 0.0))
    assert full.value == [{"name": "a", "price": None}] and full.truncated  # no stop: the list may go on


def test_items_without_a_required_field_are_left_out_for_every_decoder(tokenizer, monkeypatch):
    """`price!`: an item whose price is unknown once typed (a TOTAL line taken for an item, a price
    that is not an amount) is not an item; the items around it stay, in order. Without `!` it stays."""
    from pipkie.decoding import get_decoder
    from pipkie.decoding.pip import PipDecoder

    b = TemplateBuilder(tokenizer, max_length=256, default_budget=5)
    read = [("berry", "3/1 *"), ("TOTAL", None), ("cedar", "two"), ("ember", "12.40")]

    def fake(self, model, builder, texts, schemas, **kw):
        items = [{"name": FieldResult(n, 0.9), "price": FieldResult(p, 0.8)} for n, p in read]
        return [{"items": ItemsResult(items, 0.7)} for _ in texts]

    monkeypatch.setattr(PipDecoder, "decode", fake)
    text = "berry 3/1 *\nTOTAL\ncedar two\nember 12.40\ntotal 15.40"
    (pred,) = get_decoder("pip")(None, b, [text], [KeySchema.parse("items[name,price:money!]")])
    assert pred["items"].value == [{"name": "ember", "price": "12.40"}]  # `3/1 *` and `two` are no amounts
    (pred,) = get_decoder("pip")(None, b, [text], [KeySchema.parse("items[name,price:text!]")])
    assert [it["name"] for it in pred["items"].value] == ["berry", "cedar", "ember"]
    (pred,) = get_decoder("pip")(None, b, [text], [KeySchema.parse("items[name,price:text]")])
    assert len(pred["items"].value) == 4


def test_pip_collects_items_from_slot_tokens(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=5)
    enc = b.pip(DOC, SCHEMA)
    toks, conf = [], []
    answers = {"total": "15/5", "items[0].name": "berry", "items[0].price": "3/1", "items[1].name": "cedar"}
    for f in enc.fields:
        v = b.value_ids(answers[f.key], f.length) if f.key in answers else []
        if f.item == 1 and f.field == "price":
            v = b.value_ids(None, f.length)
        toks += (v + [b.end_id] * f.length)[: f.length]
        conf += [0.9] * f.length
    (pred,) = _collect(b, [enc], toks, conf, [SCHEMA])
    assert pred["total"].value == "15/5"
    assert pred["items"].value == [{"name": "berry", "price": "3/1"}, {"name": "cedar", "price": None}]
    assert not pred["items"].truncated and pred["items"].confidence == pytest.approx(0.9)


def test_ar_free_answer_is_parsed_into_items(tokenizer):
    from pipkie.decoding.ar import parse_free_answer

    b = TemplateBuilder(tokenizer, default_budget=4)
    text = (
        "\ntotal: 15/5<|pip_end|>\nitems 1 name: berry<|pip_end|>\nitems 1 price: 3/1<|pip_end|>"
        "\nitems 2 name: cedar<|pip_end|>\nitems 3 name:<|pip_end|>\nitems 4 name: ember<|pip_end|><|endoftext|>"
    )
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    out = parse_free_answer(b, ids, [0.5] * len(ids), ["total"], SCHEMA)
    assert out["total"].value == "15/5"
    assert out["items"].value == [{"name": "berry", "price": "3/1"}, {"name": "cedar", "price": None}]
    assert not out["items"].truncated


def test_ar_forced_stops_a_list_when_an_item_closes_at_once(tokenizer, monkeypatch):
    """A model that closes every value at once: the forced decoder asks for the flat key and item 1's
    first field, then stops the list (no other item field is asked for)."""
    from pipkie.decoding.ar import ARStats, ar_decode

    model = tiny_model(tokenizer)
    b = TemplateBuilder(tokenizer, max_length=512, default_budget=4)

    def closing(model, rows):  # the LM head's choice, whatever the state: <|pip_end|>
        return torch.ones(len(rows)), torch.full((len(rows),), b.end_id)

    monkeypatch.setattr("pipkie.decoding.ar.greedy", closing)
    stats = ARStats()
    (pred,) = ar_decode(model, b, [DOC], [SCHEMA], mode="forced", stats=stats)
    assert pred["items"].value == [] and not pred["items"].truncated and pred["total"].value is None
    assert stats.generated == 2  # total's end, then item 1's name's end: the list is over


def test_a_decoder_call_counts_ar_steps_into_stats(tokenizer, monkeypatch):
    """`Decoder.__call__(stats=...)` reaches the AR decoder (what `pipkie bench` counts), on the
    schema the call cuts to the document's lines; PIP leaves the stats as they are."""
    from pipkie.decoding import get_decoder
    from pipkie.decoding.ar import ARStats

    model = tiny_model(tokenizer)
    b = TemplateBuilder(tokenizer, max_length=512, default_budget=4)
    closing = lambda model, rows: (torch.ones(len(rows)), torch.full((len(rows),), b.end_id))  # noqa: E731
    monkeypatch.setattr("pipkie.decoding.ar.greedy", closing)
    stats = ARStats()
    (pred,) = get_decoder("ar-forced")(model, b, [DOC], [SCHEMA], stats=stats)
    assert pred["items"].value == [] and stats.generated == 2  # total's end, item 1's name's end
    before = (stats.steps, stats.generated)
    get_decoder("pip")(model, b, [DOC], [SCHEMA], stats=stats)
    assert (stats.steps, stats.generated) == before


def test_split_and_cached_passes_equal_the_one_pass_for_lists(tokenizer):
    """The group attention through a KV cache (SplitPass, the cached-document route) gives the one
    pass's predictions of every slot: the chain mask holds with a cache offset too."""
    from pipkie.decoding.cached import encode_document, pip_decode_cached
    from pipkie.decoding.pip import OnePass, SplitPass, _block_ids, _slot_mask, pip_forward

    model = tiny_model(tokenizer)
    b = TemplateBuilder(tokenizer, max_length=512, default_budget=3, field_blocks=True)
    encs = [b.pip(t, SCHEMA) for t in (DOC, "berry 1/1\ncedar 2/2\nember 3/3")]
    one = OnePass(model, b, encs, pattern="prefix_causal")(lazy=False)
    two = SplitPass(model, b, encs)(lazy=False)
    assert torch.equal(one[1], two[1]) and torch.allclose(one[0], two[0], atol=1e-5)
    doc = encode_document(model, b, DOC, reserve=b.template_length(SCHEMA))
    cached = pip_decode_cached(model, b, doc, SCHEMA, return_logits=True)
    ids = torch.tensor([encs[0].input_ids])
    full = pip_forward(
        model,
        ids,
        torch.ones_like(ids),
        _block_ids(encs[:1], ids.shape[1]),
        _slot_mask(encs[:1], ids.shape[1]),
        pattern="prefix_causal",
    )
    assert (cached - full).abs().max() < 1e-4
    changed = ids.clone()
    last_item = encs[0].fields[-1]
    changed[0, last_item.start] = 7  # a later item's slot changes nothing in an earlier item's
    other = pip_forward(
        model,
        changed,
        torch.ones_like(ids),
        _block_ids(encs[:1], ids.shape[1]),
        _slot_mask(encs[:1], ids.shape[1]),
        pattern="prefix_causal",
    )
    before = sum(f.length for f in encs[0].fields[:5])  # total, items 1 and 2: none sees item 3
    assert torch.equal(other[:before], full[:before]) and not torch.equal(other[before:], full[before:])


def test_span_fields_take_at_most_item_slots_and_keep_their_whole_value(tokenizer):
    """`item_slots=2`: each list field has 2 slots (fewer when its budget is smaller), its budget as
    the span it may read, and, in training, its whole value (the slots' targets are its first
    tokens); K grows with the room freed; flat keys are untouched."""
    kw = dict(max_length=256, default_budget=4, field_blocks=True)
    full, b = TemplateBuilder(tokenizer, **kw), TemplateBuilder(tokenizer, item_slots=2, **kw)
    values = {"total": "15/5", "items": [{"name": "berry cedar ember", "price": "3/1"}, ITEMS[1]]}
    enc, ref = b.pip(DOC, SCHEMA, values), full.pip(DOC, SCHEMA, values)
    assert [f.key for f in enc.fields] == [f.key for f in ref.fields]
    for f, g in zip(enc.fields, ref.fields):
        if f.group is None:
            assert (f.length, f.span, f.value) == (g.length, 0, None)
            continue
        assert f.length == min(2, g.length) and f.width == g.length
        assert f.span == (g.length if g.length > 2 else 0)
        whole = ref.targets[g.start : g.start + g.length]
        assert enc.targets[f.start : f.start + f.length] == whole[: f.length]
        if f.span:
            assert b.decode_value(f.value + [b.end_id]) == b.decode_value(whole)
    name = enc.fields[1]
    assert len(name.value) > name.length  # the name does not fit its slots: the span carries it
    assert b.template_length(SCHEMA) < full.template_length(SCHEMA)
    wide = KeySchema((), (Group("items", SCHEMA.groups[0].fields),))
    assert items_budgets(b, wide)[0] > items_budgets(full, wide)[0]
    with pytest.raises(ValueError, match="item_slots"):
        TemplateBuilder(tokenizer, item_slots=-1)


def test_span_nll_is_the_likelihood_of_the_value_as_one_document_span():
    """span_nll = −log Σ_m p_start(m) p(L | m) over the starts m where the document spells the value;
    0 (no loss) when it spells it nowhere; field_nll adds it to slot 0's NLL."""
    from pipkie.model.copyhead import FieldSpan, span_nll

    stream_ids = torch.tensor([5, 6, 7, 5, 6, 9])
    p_start = torch.tensor([0.1, 0.2, 0.1, 0.4, 0.1, 0.1])
    p_len = torch.full((6, 4), 0.25)
    p_len[3] = torch.tensor([0.1, 0.6, 0.2, 0.1])
    f = FieldSpan(0, torch.arange(1), torch.arange(6), stream_ids, span=4, value=torch.tensor([5, 6]))
    want = -torch.log(torch.tensor(0.1 * 0.25 + 0.4 * 0.6))  # "5 6" starts at 0 and at 3
    assert torch.allclose(span_nll(p_start, p_len, f), want)
    nowhere = FieldSpan(0, torch.arange(1), torch.arange(6), stream_ids, span=4, value=torch.tensor([6, 5, 9]))
    assert float(span_nll(p_start, p_len, nowhere)) == 0.0


def test_span_fields_decode_in_one_pass_and_refuse_refinement(tokenizer):
    """A span-field template (item_slots=1) decodes in one pass into lists like the full one (answers
    as wide as the budgets); refinement, which feeds the slots' tokens back, is refused with a
    clear error instead of mixing span answers into slot inputs."""
    from pipkie.model.copyhead import CopyHead, attach

    model = tiny_model(tokenizer, slot_tokens=4)
    attach(model, CopyHead(model.config.hidden_size, 16))
    b = TemplateBuilder(
        tokenizer, max_length=512, default_budget=3, slot_tokens=4, field_blocks=True, copy=True, item_slots=1
    )
    out = pip_decode(model, b, [DOC, "berry 1/1"], [SCHEMA] * 2)
    assert all(isinstance(p["items"], ItemsResult) and isinstance(p["total"], FieldResult) for p in out)
    enc = b.pip(DOC, SCHEMA)
    assert all(f.length == 1 and f.width > 1 for f in enc.fields if f.group)
    with pytest.raises(ValueError, match="refine_steps=0"):
        pip_decode(model, b, [DOC], [SCHEMA], refine_steps=1)
