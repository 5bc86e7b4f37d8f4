"""Attention semantics of the named patterns, on tiny random Qwen2 and Llama models."""

from dataclasses import replace

import pytest
import torch

from pipkie.decoding.cached import encode_document, pip_decode_cached
from pipkie.decoding.pip import _block_ids, _slot_mask, pip_forward
from pipkie.model.template import TemplateBuilder
from pipkie.schema import KeySchema
from tests.conftest import tiny_model

DOC = "apple berry cedar\ndelta 12/3 ember\nfrost grove 9/1"
SCHEMA = KeySchema.parse("company,date,total")


def _inputs(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=128, default_budget=4)
    enc = b.pip(DOC, SCHEMA)
    ids = torch.tensor([enc.input_ids])
    return b, enc, ids


def _logits_all(model, ids, enc, pattern):
    keep = torch.ones_like(ids, dtype=torch.bool)
    return pip_forward(model, ids, torch.ones_like(ids), _block_ids([enc], ids.shape[1]), keep, pattern=pattern)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("pattern", ["full", "prefix_causal"])
def test_later_mask_changes_earlier_mask(tokenizer, arch, attn, pattern):
    model = tiny_model(tokenizer, arch, attn)
    b, enc, ids = _inputs(tokenizer)
    first, last = enc.fields[0].start, enc.fields[-1].start + enc.fields[-1].length - 1
    changed = ids.clone()
    changed[0, last] = tokenizer.convert_tokens_to_ids("Ġapple") if "Ġapple" in tokenizer.get_vocab() else 5
    a, c = _logits_all(model, ids, enc, pattern), _logits_all(model, changed, enc, pattern)
    assert (a[first] - c[first]).abs().max() > 1e-4, "an earlier mask must see a later one"


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_causal_control_does_not_see_later_tokens(tokenizer, arch):
    """The same probe under plain causal attention must show no effect: the probe can fail."""
    model = tiny_model(tokenizer, arch)
    b, enc, ids = _inputs(tokenizer)
    first, last = enc.fields[0].start, enc.fields[-1].start + enc.fields[-1].length - 1
    changed = ids.clone()
    changed[0, last] = 5
    a, c = _logits_all(model, ids, enc, "causal"), _logits_all(model, changed, enc, "causal")
    assert torch.equal(a[first], c[first])


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_prefix_causal_prefix_never_sees_the_future(tokenizer, arch):
    model = tiny_model(tokenizer, arch)
    b, enc, ids = _inputs(tokenizer)
    base = _logits_all(model, ids, enc, "prefix_causal")
    for i in (3, enc.prefix_len // 2, enc.prefix_len - 2):
        changed = ids.clone()
        changed[0, i + 1 :] = torch.randint(5, 300, (ids.shape[1] - i - 1,))
        out = _logits_all(model, changed, enc, "prefix_causal")
        assert (out[: i + 1] - base[: i + 1]).abs().max() < 1e-5
        assert (out[i + 1 :] - base[i + 1 :]).abs().max() > 1e-4  # and the change did reach later positions


def test_full_prefix_does_see_the_future(tokenizer):
    model = tiny_model(tokenizer)
    b, enc, ids = _inputs(tokenizer)
    changed = ids.clone()
    changed[0, -1] = 5
    a, c = _logits_all(model, ids, enc, "full"), _logits_all(model, changed, enc, "full")
    assert (a[2] - c[2]).abs().max() > 1e-4


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
def test_cached_document_equals_uncached(tokenizer, arch):
    """prefix_causal over a reused document cache = one uncached pass, for two key sets."""
    model = tiny_model(tokenizer, arch)
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=5)
    doc = encode_document(model, b, DOC, reserve=64)
    for keys in ("company,date,total", "address,name"):
        schema = KeySchema.parse(keys)
        cached = pip_decode_cached(model, b, doc, schema, return_logits=True)
        enc = b.pip(DOC, schema)
        ids = torch.tensor([enc.input_ids])
        full = pip_forward(
            model,
            ids,
            torch.ones_like(ids),
            _block_ids([enc], ids.shape[1]),
            _slot_mask([enc], ids.shape[1]),
            pattern="prefix_causal",
        )
        diff = (cached - full).abs().max().item()
        print(f"{arch} {keys}: max |cached - uncached| = {diff:.2e}")
        assert diff < 1e-4
        assert doc.cache.get_seq_length() == doc.length  # cropped back for the next key set


def test_packed_blocks_are_isolated(tokenizer):
    """Training packs several answer blocks after one document; each must act as if alone."""
    from pipkie.model.attention import build_attention_mask

    model = tiny_model(tokenizer)
    block = torch.tensor([[0, 0, 0, 1, 1, 2, 2]])
    attn = torch.ones_like(block)
    m = build_attention_mask(
        model,
        "prefix_causal",
        attn,
        query_length=7,
        block_ids=block,
        position_ids=torch.tensor([[0, 1, 2, 3, 4, 3, 4]]),
    )
    m = m[0, 0] if m.dtype == torch.bool else m[0, 0] == 0
    assert m[3, 4] and m[4, 3] and m[3, 0]  # bidirectional in block 1, sees the prefix
    assert not m[5, 3] and not m[5, 4] and m[5, 6] and m[6, 5]  # block 2 blind to block 1
    assert not m[1, 2]  # prefix stays causal


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("pattern", ["causal", "prefix_causal", "full"])
@pytest.mark.parametrize("cached", [False, True])
def test_index_mask_equals_transformers_vmap_path(tokenizer, attn, pattern, cached):
    """build_attention_mask broadcasts our predicates itself; the mask must be exactly the one
    create_causal_mask builds by vmapping them (left padding, packed blocks, with and without a cache)."""
    from transformers.cache_utils import DynamicCache
    from transformers.masking_utils import create_causal_mask

    from pipkie.model.attention import build_attention_mask, extra_pattern, isolated_template_blocks

    model = tiny_model(tokenizer, attn=attn)
    block = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 1, 2, 2], [0, 0, 0, 0, 1, 1, 2, 2, 2, 0]])
    attn_mask = torch.tensor([[0, 0, 1, 1, 1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1, 1, 0]])
    past, cache = 0, None
    if cached:
        past, cache = 4, DynamicCache(config=model.config)
        kv = torch.zeros(
            2, model.config.num_key_value_heads, past, model.config.hidden_size // model.config.num_attention_heads
        )
        for layer in range(model.config.num_hidden_layers):
            cache.update(kv, kv, layer)
    q = attn_mask.shape[1] - past
    pos = torch.arange(past, past + q)[None].expand(2, -1)
    ours = build_attention_mask(
        model, pattern, attn_mask, query_length=q, block_ids=block, cache=cache, position_ids=pos
    )
    ref = create_causal_mask(
        config=model.config,
        inputs_embeds=torch.empty(2, q, 1, dtype=model.dtype),
        attention_mask=attn_mask,
        cache=cache,
        position_ids=pos,
        or_mask_function=extra_pattern(pattern, block),
        and_mask_function=isolated_template_blocks(block) if pattern != "full" else None,
        allow_is_causal_skip=False,
    )
    assert ours.shape == ref.shape == (2, 1, q, attn_mask.shape[1])
    assert torch.equal(ours, ref)


@pytest.mark.parametrize("arch", ["qwen2", "llama"])
@pytest.mark.parametrize("field_blocks", [False, True])
def test_pip_sdpa_runs_the_prefix_on_the_causal_kernel_with_the_same_result(tokenizer, arch, field_blocks, monkeypatch):
    """ "pipkie_sdpa" splits a PIP pass: prefix rows on sdpa's causal kernel, template rows through
    their slice of the mask. Same hidden states as sdpa with the whole explicit mask; with left
    padding in the batch (and a template this short) the whole mask (and still agree)."""
    from pipkie.decoding.pip import OnePass
    from pipkie.model.attention import PIP_SDPA, causal_rows, enable_pip_attention

    model = tiny_model(tokenizer, arch)
    b = TemplateBuilder(tokenizer, max_length=128, default_budget=4, field_blocks=field_blocks)
    short = b.pip(DOC, SCHEMA)
    long = b.pip(DOC + "\nlonger line here", SCHEMA)
    calls = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def spy(q, k, v, attn_mask=None, **kw):
        calls.append((q.shape[2], k.shape[2], attn_mask is None and kw.get("is_causal", False)))
        return sdpa(q, k, v, attn_mask=attn_mask, **kw)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", spy)
    with torch.inference_mode():
        runs = [OnePass(model, b, encs, pattern="prefix_causal") for encs in ([short], [short, long])]
        ref = [r._hidden(r.ids)[0] for r in runs]  # sdpa, the whole explicit mask
        assert enable_pip_attention(model) and model.config._attn_implementation == PIP_SDPA
        calls.clear()
        one = OnePass(model, b, [short], pattern="prefix_causal")
        assert causal_rows(model, "prefix_causal", one.attn, one.block) == short.prefix_len
        h1 = one._hidden(one.ids)[0]
        layers = model.config.num_hidden_layers
        assert (
            calls
            == [
                (short.prefix_len, short.prefix_len, True),
                (len(short.input_ids) - short.prefix_len, len(short.input_ids), False),
            ]
            * layers
        )
        assert (h1 - ref[0]).abs().max() < 1e-5
        calls.clear()
        two = OnePass(model, b, [short, long], pattern="prefix_causal")
        assert causal_rows(model, "prefix_causal", two.attn, two.block) == 0  # left padding: the mask
        h2 = two._hidden(two.ids)[0]
        # a short flat template is one run over every key: not worth splitting, the whole mask
        width = two.ids.shape[1]
        assert calls == [(width, width, False)] * layers
        assert (h2 - ref[1]).abs().max() < 1e-5
        assert causal_rows(model, "full", one.attn, one.block) == 0


@pytest.mark.parametrize("rows", [7, 128])
def test_template_rows_run_by_run_see_what_the_mask_allows_and_agree(tokenizer, rows, monkeypatch):
    """`template_chunks` keeps, for every run of template rows, the prefix and one range of template
    keys that spans every key those rows may see (so the softmax is sdpa's), and a long list template
    (40 item groups, each seeing itself and the group before) asks each run for a small share of
    the keys. The hidden states equal sdpa's with the whole explicit mask."""
    import pipkie.model.attention as A
    from pipkie.decoding.pip import OnePass
    from pipkie.model.attention import build_attention_mask, causal_rows, enable_pip_attention, template_chunks

    model = tiny_model(tokenizer, "llama")
    b = TemplateBuilder(tokenizer, max_length=4096, default_budget=4)
    parsed = KeySchema.parse("company,total,items[name,price]")
    schema = replace(parsed, groups=(replace(parsed.groups[0], max_items=40),))
    enc = b.pip(DOC * 3, schema)
    with torch.inference_mode():
        run = OnePass(model, b, [enc], pattern="prefix_causal")
        ref = run._hidden(run.ids)[0]
        assert enable_pip_attention(model)
        c = causal_rows(model, "prefix_causal", run.attn, run.block)
        mask = build_attention_mask(
            model, "prefix_causal", run.attn, query_length=run.ids.shape[1], block_ids=run.block
        )
        plan = template_chunks(mask, c, rows)
        assert [r0 for r0, *_ in plan] == list(range(c, mask.shape[2], rows)) and plan[-1][1] == mask.shape[2]
        for r0, r1, lo, hi, sub in plan:
            seen = mask[0, 0, r0:r1].nonzero()[:, 1]
            assert bool(((seen < c) | ((seen >= lo) & (seen < hi))).all())  # nothing the rows may see is left out
            assert torch.equal(sub[0, 0], torch.cat([mask[0, 0, r0:r1, :c], mask[0, 0, r0:r1, lo:hi]], -1))
        if rows == 7:  # runs within a group or two: a few groups' keys, not the whole template
            assert max(hi - lo for _, _, lo, hi, _ in plan) < (mask.shape[2] - c) / 5
        flat = b.pip(DOC, KeySchema.parse("company,total"))  # one short run over every key: no plan
        one = OnePass(model, b, [flat], pattern="prefix_causal")
        m1 = build_attention_mask(model, "prefix_causal", one.attn, query_length=one.ids.shape[1], block_ids=one.block)
        assert template_chunks(m1, causal_rows(model, "prefix_causal", one.attn, one.block), rows) is None
        padded = OnePass(model, b, [enc, b.pip(DOC, schema)], pattern="prefix_causal")  # left-padded batch
        model.set_attn_implementation("sdpa")  # the reference: sdpa with the whole explicit mask
        ref2 = padded._hidden(padded.ids)[0]
        assert enable_pip_attention(model)
        monkeypatch.setattr(A, "CHUNK_ROWS", rows)  # what the pass itself uses
        h = run._hidden(run.ids)[0]
        h2 = padded._hidden(padded.ids)[0]
    assert (h - ref).abs().max() < 1e-5
    assert (h2 - ref2)[padded.attn.bool()].abs().max() < 1e-5
    assert template_chunks(None, c) is None and template_chunks(mask.float(), c) is None
    assert template_chunks(mask, 0) is None and template_chunks(mask, mask.shape[2]) is None


def test_pip_sdpa_is_plain_sdpa_without_pip_rows(tokenizer):
    """AR decoding and plain causal passes under "pipkie_sdpa" are sdpa's, bit for bit; vision-language
    configs (sub-configs) and non-sdpa models are not switched."""
    from pipkie.model.attention import enable_pip_attention

    model = tiny_model(tokenizer)
    ids = torch.randint(5, 300, (2, 9))
    attn = torch.ones_like(ids)
    attn[0, :3] = 0
    with torch.inference_mode():
        ref = model(input_ids=ids, attention_mask=attn).logits
        enable_pip_attention(model)
        assert torch.equal(model(input_ids=ids, attention_mask=attn).logits, ref)
    assert not enable_pip_attention(tiny_model(tokenizer, attn="eager"))
