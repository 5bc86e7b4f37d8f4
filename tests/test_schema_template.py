"""Key schemas and the template builder: formats, special tokens, budgets, errors."""

import json
import warnings

import pytest
from pydantic import BaseModel, Field

from pipkie.model.template import END, IGNORE, MASK, DocumentTooLong, TemplateBuilder
from pipkie.schema import Key, KeySchema, SchemaError
from tests.conftest import tiny_model


def test_schema_sources_agree(tmp_path):
    class Receipt(BaseModel):
        company: str = Field(description="seller")
        date: str | None = None
        total: str = Field(max_length=12)

    from_model = KeySchema.parse(Receipt)
    assert from_model.names == ["company", "date", "total"]
    assert from_model.keys[0].description == "seller"
    assert from_model.keys[2].max_chars == 12 and from_model.keys[2].max_tokens is None  # the tokenizer decides
    assert KeySchema.parse("company, date,total").names == from_model.names
    assert KeySchema.parse(["company", "date", "total"]).names == from_model.names
    p = tmp_path / "s.json"
    p.write_text(json.dumps(Receipt.model_json_schema()))
    assert KeySchema.parse(str(p)).names == from_model.names


@pytest.mark.parametrize(
    "spec,message",
    [
        ([], "empty"),
        ("", "blank"),
        ("a,a", "twice"),
        ("a,,b", "blank"),
        (["x" * 65], "characters long"),
        ("total:", "unknown value type ''"),  # name:type, the type left out
        ("a:b:date", "characters other"),
        ({"properties": {"n": {"type": "integer"}}}, "must be a string"),
        ({"type": "object"}, "properties"),
        ({"properties": {"d": {"type": "string", "maxLength": "ten"}}}, "must be an integer"),
        ({"properties": {"d": {"type": "string", "maxLength": 0}}}, "between 1 and"),
        ({"properties": {"d": {"type": "string", "x-max-tokens": 1.5}}}, "must be an integer"),
    ],
)
def test_schema_errors(spec, message):
    with pytest.raises(SchemaError, match=message):
        KeySchema.parse(spec)


def test_special_tokens_added_and_embeddings_resized(tokenizer):
    model = tiny_model(tokenizer)
    assert model.get_input_embeddings().weight.shape[0] >= len(tokenizer)
    b = TemplateBuilder(tokenizer)
    assert len({b.mask_id, b.end_id, b.answer_id, b.eos_id}) == 4
    assert tokenizer.tokenize(MASK + END) == [MASK, END]  # never split


def test_pip_template_layout_and_targets(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=200, budgets={"date": 3}, default_budget=5)
    schema = KeySchema((Key("company"), Key("date"), Key("total", max_tokens=2)))
    enc = b.pip("apple berry\ncedar", schema, values={"company": "apple", "date": None, "total": "9/1"})
    assert enc.input_ids[enc.prefix_len - 1] == b.answer_id
    assert [(f.key, f.length) for f in enc.fields] == [("company", 5), ("date", 3), ("total", 2)]
    for f in enc.fields:
        assert enc.input_ids[f.start - len(b.header(f.key)) : f.start] == b.header(f.key)
        assert enc.input_ids[f.start : f.start + f.length] == [b.mask_id] * f.length
    c = enc.fields[0]
    tgt = enc.targets[c.start : c.start + c.length]
    assert b.decode_value(tgt) == "apple" and tgt[-1] == b.end_id  # value then end tokens
    d = enc.fields[1]
    assert b.decode_value(enc.targets[d.start : d.start + d.length]) is None  # `unknown` = missing
    assert (
        tokenizer.decode(enc.targets[d.start : d.start + 1] + enc.targets[d.start + 1 : d.start + 2])
        .strip()
        .startswith("unk")
    )
    assert sum(t != IGNORE for t in enc.targets) == 10


def test_ar_sequence_matches_template(tokenizer):
    b = TemplateBuilder(tokenizer, default_budget=6)
    schema = KeySchema.parse("company,total")
    enc = b.ar("apple", schema, {"company": "apple berry", "total": "9/1"})
    answer = enc.input_ids[enc.prefix_len :]
    assert answer[-1] == b.eos_id and answer.count(b.end_id) == 2
    assert enc.targets[enc.prefix_len - 1] == answer[0]  # next-token targets, shifted by one
    assert enc.targets[-1] == IGNORE


def test_overlong_document_keeps_head_and_tail_or_raises_but_keeps_template(tokenizer):
    text = " ".join(["apple berry cedar"] * 200) + " ocean 42/7"
    schema = KeySchema.parse("company,date")
    b = TemplateBuilder(tokenizer, max_length=96, default_budget=8)
    with pytest.warns(UserWarning, match="tokens are dropped from the middle"):
        enc = b.pip(text, schema)
    whole = b.document_ids(text)
    room = 96 - b.template_length(schema) - len(b.instruction_ids) - 1
    assert len(enc.input_ids) == 96 and enc.truncated == len(whole) - room
    assert enc.input_ids[-8:] == [b.mask_id] * 8  # the template survives whole
    doc = enc.input_ids[len(b.instruction_ids) : enc.prefix_len - 1]
    a, z = enc.seam
    head, tail = a - len(b.instruction_ids), enc.prefix_len - 1 - z
    assert doc[:head] == whole[:head] and doc[-tail:] == whole[-tail:] and tail >= head > 0
    assert tokenizer.decode(doc[-tail:]).endswith("ocean 42/7")  # the end of the document is in
    assert enc.kept == list(range(head)) + [-1] * (z - a) + list(range(len(whole) - tail, len(whole)))
    with pytest.warns(UserWarning, match="from the middle"):
        ar = b.ar_prompt(text, schema)  # AR prompts are cut the same way
    assert tokenizer.decode(ar.input_ids[ar.seam[1] : ar.prefix_len]).split("\n")[0].endswith("ocean 42/7")
    strict = TemplateBuilder(tokenizer, max_length=96, default_budget=8, on_overflow="error")
    with pytest.raises(DocumentTooLong, match="only"):
        strict.pip(text, schema)
    with pytest.raises(DocumentTooLong, match="no room"):
        TemplateBuilder(tokenizer, max_length=16, default_budget=8).pip("apple", schema)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        b.pip("apple berry", schema)  # a short document: no warning


def test_key_descriptions_reach_the_template_and_the_ar_prompt(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=4)

    class Receipt(BaseModel):
        total: str = Field(description="the  amount\n paid")
        date: str

    schema = KeySchema.parse(Receipt)
    assert schema.keys[0].description == "the amount paid"  # whitespace collapsed
    enc = b.pip("apple berry 12.50", schema)
    template = tokenizer.decode(enc.input_ids[enc.prefix_len :])
    assert "total (the amount paid):" in template and "\ndate:" in template
    assert len(enc.fields) == 2 and enc.fields[0].length == 4
    prompt = tokenizer.decode(b.ar_prompt("apple berry 12.50", schema).input_ids)
    assert "keys: total (the amount paid), date" in prompt
    answer = tokenizer.decode(b.ar_answer(schema, {"total": "12.50", "date": None}))
    assert "total:" in answer and "amount paid" not in answer  # AR answers write names only
    with pytest.raises(SchemaError, match="description"):
        Key("total", "x" * 201)


def test_max_length_becomes_enough_tokens_for_that_many_digits():
    """JSON schema maxLength is characters; the budget comes from the model's tokenizer. SmolLM2
    writes one token per digit: maxLength 10 must hold "15/01/2019" (11 tokens with the space) and
    its end token, where characters/3 gave 5 slots."""
    from pathlib import Path

    from pipkie.model.modeling import load_tokenizer

    shipped = Path(__file__).resolve().parents[1] / "models" / "pipkie"
    tok = load_tokenizer(shipped)
    schema = KeySchema.parse(
        {
            "properties": {
                "date": {"type": "string", "maxLength": 10},
                "total": {"type": "string", "maxLength": 10, "x-max-tokens": 3},
                "note": {"type": "string"},
            }
        }
    )
    date, total, note = schema.keys
    assert (date.max_chars, date.max_tokens, total.max_tokens, total.max_chars) == (10, None, 3, None)
    b = TemplateBuilder(tok, budgets={"date": 4, "note": 7})
    assert [b.budget(k) for k in schema] == [12, 3, 7]  # max_chars over the model's budget; max_tokens over both
    assert len(b.value_ids("15/01/2019", 99)) == 11
    enc = b.pip("Date 15/01/2019", schema, values={"date": "15/01/2019", "total": None, "note": None})
    f = enc.fields[0]
    slots = enc.targets[f.start : f.start + f.length]
    assert b.decode_value(slots) == "15/01/2019" and slots[-1] == b.end_id  # whole, and closed
    assert all(b.chars_budget(n) >= len(b.value_ids("9" * n, 999)) + 1 for n in (1, 5, 30))


def test_chars_budget_covers_digits_with_any_tokenizer(tokenizer):
    b = TemplateBuilder(tokenizer)
    for n in (1, 4, 10, 25):
        assert b.chars_budget(n) == len(b.value_ids("9" * n, 999)) + 1
    assert b.budget(Key("x", max_chars=1000)) == 256  # capped at MAX_VALUE_TOKENS
