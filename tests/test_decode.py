"""Decoding: one forward pass per batch, refinement passes, batching = one by one, AR parsing."""

import pytest
import torch

from pipkie.decoding.ar import ARStats, ar_decode, parse_free_answer
from pipkie.decoding.pip import pip_decode
from pipkie.model.template import TemplateBuilder
from pipkie.schema import KeySchema
from tests.conftest import tiny_model

DOCS = ["apple berry cedar\ndelta 12/3 ember", "frost grove\nharbor island jade kite 9/1\nlemon maple north", "ocean"]
SCHEMA = KeySchema.parse("company,date,total")


class CountingForward:
    """Counts the passes through the decoder (PIP runs the decoder and applies the LM head itself)."""

    def __init__(self, model):
        decoder = getattr(model, model.base_model_prefix)
        self.model, self.calls = model, 0
        self.orig = decoder.forward

        def counted(*a, **kw):
            self.calls += 1
            return self.orig(*a, **kw)

        decoder.forward = counted


@pytest.fixture
def setup(tokenizer):
    return tiny_model(tokenizer, "llama"), TemplateBuilder(tokenizer, max_length=128, default_budget=4)


@pytest.mark.parametrize("refine", [0, 1, 2])
def test_pip_forward_count(setup, refine):
    model, b = setup
    counter = CountingForward(model)
    out = pip_decode(model, b, DOCS, [SCHEMA] * 3, refine_steps=refine, split=False)
    assert counter.calls == 1 + refine
    assert [list(p) for p in out] == [SCHEMA.names] * 3


@pytest.mark.parametrize("refine", [0, 1])
def test_split_pass_runs_each_token_once(setup, refine):
    """The split route: one call over the prefixes, one over the templates (+ one per refinement)."""
    model, b = setup
    seen = []
    decoder = getattr(model, model.base_model_prefix)
    orig = decoder.forward
    decoder.forward = lambda *a, **kw: (seen.append(kw["input_ids"].shape[1]), orig(*a, **kw))[1]
    pip_decode(model, b, DOCS, [SCHEMA] * 3, refine_steps=refine, split=True)
    encs = [b.pip(t, SCHEMA) for t in DOCS]
    assert seen == [max(e.prefix_len for e in encs)] + [len(encs[0].input_ids) - encs[0].prefix_len] * (1 + refine)


@pytest.mark.parametrize("refine", [0, 1])
def test_split_pass_equals_one_pass(setup, refine):
    model, b = setup
    schemas = [SCHEMA, KeySchema.parse("total,address"), SCHEMA]
    one = pip_decode(model, b, DOCS, schemas, refine_steps=refine, split=False)
    two = pip_decode(model, b, DOCS, schemas, refine_steps=refine, split=True)
    for p, q, schema in zip(one, two, schemas):
        for k in schema.names:
            assert p[k].tokens == q[k].tokens
            assert abs(p[k].confidence - q[k].confidence) < 1e-4


def test_pip_batched_equals_single(setup):
    model, b = setup
    schemas = [SCHEMA, KeySchema.parse("total,address"), SCHEMA]
    batch = pip_decode(model, b, DOCS, schemas)
    for text, schema, got in zip(DOCS, schemas, batch):
        alone = pip_decode(model, b, [text], [schema])[0]
        for k in schema.names:
            assert got[k].tokens == alone[k].tokens
            assert got[k].confidence == pytest.approx(alone[k].confidence, rel=1e-4, abs=1e-6)


@pytest.mark.parametrize("mode", ["free", "forced"])
def test_ar_batched_equals_single(tokenizer, mode):
    model = tiny_model(tokenizer, "qwen2", seed=3)
    b = TemplateBuilder(tokenizer, max_length=128, default_budget=4)
    schemas = [SCHEMA, KeySchema.parse("total,address"), SCHEMA]
    batch = ar_decode(model, b, DOCS, schemas, mode=mode)
    for text, schema, got in zip(DOCS, schemas, batch):
        alone = ar_decode(model, b, [text], [schema], mode=mode)[0]
        assert {k: v.tokens for k, v in got.items()} == {k: v.tokens for k, v in alone.items()}


def test_ar_forced_generates_only_values(setup):
    """Forced mode: at most budget tokens per value; steps = generated tokens - 1 (one per step)."""
    model, b = setup
    stats = ARStats()
    out = ar_decode(model, b, DOCS[:1], [SCHEMA], mode="forced", stats=stats)[0]
    assert list(out) == SCHEMA.names
    assert all(len(f.tokens) <= 4 + 1 for f in out.values())
    assert stats.generated == stats.steps + 1


def test_parse_free_answer(tokenizer):
    b = TemplateBuilder(tokenizer)
    ids = (
        b.header("company")
        + b.value_ids("apple berry", 8)
        + [b.end_id]
        + b.header("total")
        + b.value_ids(None, 8)
        + [b.end_id]
        + b.header("bogus")
        + b.value_ids("x", 8)
        + [b.end_id, b.eos_id]
    )
    out = parse_free_answer(b, ids, [0.5] * len(ids), ["company", "total", "date"])
    assert out["company"].value == "apple berry" and out["company"].confidence == pytest.approx(0.5)
    assert out["total"].value is None and out["total"].confidence > 0  # written as `unknown`
    assert out["date"].value is None and out["date"].confidence == 0  # never written


def test_padded_vocabulary_changes_no_output(tokenizer):
    """pad_vocabulary (inference: the LM head's rows padded to a multiple of 64 for fast GEMMs) must
    give the same logits, the same PIP predictions and the same AR answers."""
    import copy

    from pipkie.model.copyhead import CopyHead, attach
    from pipkie.model.modeling import VocabSlice, pad_vocabulary

    model = tiny_model(tokenizer, slot_tokens=4)
    attach(model, CopyHead(model.config.hidden_size, dim=8).eval())
    n = model.get_output_embeddings().weight.shape[0]
    assert n % 64  # the tiny vocabulary is not a multiple of 64: the test pads something
    padded = copy.deepcopy(model)
    pad_vocabulary(padded)
    assert isinstance(padded.get_output_embeddings(), VocabSlice)
    assert padded.get_input_embeddings().weight.shape[0] % 64 == 0
    ids = torch.tensor([tokenizer("apple berry 12/3 cedar").input_ids])
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, padded(input_ids=ids).logits)
    b = TemplateBuilder(tokenizer, max_length=160, default_budget=4, slot_tokens=4, field_blocks=True, copy=True)
    texts, schemas = DOCS[:2], [SCHEMA, SCHEMA]
    for got, want in zip(pip_decode(padded, b, texts, schemas), pip_decode(model, b, texts, schemas)):
        assert {k: (f.tokens, f.confidence) for k, f in got.items()} == {
            k: (f.tokens, f.confidence) for k, f in want.items()
        }
    for mode in ("free", "forced"):
        assert ar_decode(padded, b, texts, schemas, mode=mode) == ar_decode(model, b, texts, schemas, mode=mode)


def test_a_value_without_its_end_token_is_truncated(tokenizer):
    """A value that fills its budget (no end token among its slots, or an AR answer cut by its token
    budget) is flagged; one closed inside its budget, or missing, is not."""
    from pipkie.decoding.results import field_result as _field_result

    b = TemplateBuilder(tokenizer)
    apple = b.value_ids("apple berry", 8)
    assert _field_result(b, apple + [b.end_id] * 2, [0.9] * (len(apple) + 2)).truncated is False
    full = _field_result(b, apple, [0.9] * len(apple))
    assert full.truncated is True and full.value == "apple berry"
    assert _field_result(b, [b.end_id] * 3, [0.9] * 3).truncated is False  # empty: missing, nothing cut
    ids = b.header("company") + apple + [b.end_id] + b.header("total") + b.value_ids("9/1", 8)  # ran out here
    out = parse_free_answer(b, ids, [0.5] * len(ids), ["company", "total"])
    assert (out["company"].truncated, out["total"].truncated, out["total"].value) == (False, True, "9/1")
