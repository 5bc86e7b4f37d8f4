"""Key schemas and the template builder: formats, special tokens, budgets, errors."""

import json
import warnings

import pytest
from pydantic import BaseModel, Field

from pipkie.schema import Key, KeySchema, SchemaError
from pipkie.template import END, MASK, DocumentTooLong, TemplateBuilder, IGNORE
from tests.conftest import tiny_model


def test_schema_sources_agree(tmp_path):
    class Receipt(BaseModel):
        company: str = Field(description="seller")
        date: str | None = None
        total: str = Field(max_length=12)

    from_model = KeySchema.parse(Receipt)
    assert from_model.names == ["company", "date", "total"]
    assert from_model.keys[0].description == "seller"
    assert from_model.keys[2].max_tokens == 5  # 12 characters → ceil(12/3) + 1 tokens
    assert KeySchema.parse("company, date,total").names == from_model.names
    assert KeySchema.parse(["company", "date", "total"]).names == from_model.names
    p = tmp_path / "s.json"
    p.write_text(json.dumps(Receipt.model_json_schema()))
    assert KeySchema.parse(str(p)).names == from_model.names


@pytest.mark.parametrize("spec,message", [
    ([], "empty"),
    ("", "blank"),
    ("a,a", "twice"),
    ("a,,b", "blank"),
    (["x" * 65], "characters long"),
    ("total:", "characters other"),
    ({"properties": {"n": {"type": "integer"}}}, "must be a string"),
    ({"type": "object"}, "properties"),
])
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
        assert enc.input_ids[f.start - len(b.header(f.key)): f.start] == b.header(f.key)
        assert enc.input_ids[f.start: f.start + f.length] == [b.mask_id] * f.length
    c = enc.fields[0]
    tgt = enc.targets[c.start: c.start + c.length]
    assert b.decode_value(tgt) == "apple" and tgt[-1] == b.end_id  # value then end tokens
    d = enc.fields[1]
    assert b.decode_value(enc.targets[d.start: d.start + d.length]) is None  # `unknown` = missing
    assert tokenizer.decode(enc.targets[d.start: d.start + 1] + enc.targets[d.start + 1: d.start + 2]).strip().startswith("unk")
    assert sum(t != IGNORE for t in enc.targets) == 10


def test_ar_sequence_matches_template(tokenizer):
    b = TemplateBuilder(tokenizer, default_budget=6)
    schema = KeySchema.parse("company,total")
    enc = b.ar("apple", schema, {"company": "apple berry", "total": "9/1"})
    answer = enc.input_ids[enc.prefix_len:]
    assert answer[-1] == b.eos_id and answer.count(b.end_id) == 2
    assert enc.targets[enc.prefix_len - 1] == answer[0]  # next-token targets, shifted by one
    assert enc.targets[-1] == IGNORE


def test_overlong_document_truncates_or_raises_but_keeps_template(tokenizer):
    text = " ".join(["apple berry cedar"] * 200)
    schema = KeySchema.parse("company,date")
    b = TemplateBuilder(tokenizer, max_length=96, default_budget=8)
    with pytest.warns(UserWarning, match="tokens are dropped"):
        enc = b.pip(text, schema)
    assert len(enc.input_ids) == 96 and enc.truncated > 0
    assert enc.input_ids[-8:] == [b.mask_id] * 8  # the template survives whole
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
    template = tokenizer.decode(enc.input_ids[enc.prefix_len:])
    assert "total (the amount paid):" in template and "\ndate:" in template
    assert len(enc.fields) == 2 and enc.fields[0].length == 4
    prompt = tokenizer.decode(b.ar_prompt("apple berry 12.50", schema).input_ids)
    assert "keys: total (the amount paid), date" in prompt
    answer = tokenizer.decode(b.ar_answer(schema, {"total": "12.50", "date": None}))
    assert "total:" in answer and "amount paid" not in answer  # AR answers write names only
    with pytest.raises(SchemaError, match="description"):
        Key("total", "x" * 201)
