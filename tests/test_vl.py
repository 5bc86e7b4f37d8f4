"""Qwen2-VL (tiny random config): an image plus text through PIP, with explicit M-RoPE positions."""

import pytest
import torch

from pipkie.decoding.pip import _block_ids, pip_decode, pip_forward
from pipkie.model.template import SPECIAL_TOKENS, TemplateBuilder
from pipkie.schema import KeySchema
from pipkie.train.tokenizer import train_tokenizer
from tests.conftest import corpus

VISION = ["<|vision_start|>", "<|image_pad|>", "<|vision_end|>"]
SCHEMA = KeySchema.parse("company,total")


@pytest.fixture(scope="module")
def vl():
    from transformers import Qwen2VLConfig, Qwen2VLForConditionalGeneration

    tok = train_tokenizer(corpus(), vocab_size=400, special=list(SPECIAL_TOKENS) + VISION)
    start, pad, end = tok.convert_tokens_to_ids(VISION)
    torch.manual_seed(0)
    cfg = Qwen2VLConfig(
        text_config=dict(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            rope_parameters={"rope_type": "default", "mrope_section": [2, 3, 3], "rope_theta": 10000.0},
        ),
        vision_config=dict(
            depth=1,
            embed_dim=32,
            hidden_size=64,
            num_heads=2,
            mlp_ratio=2,
            patch_size=14,
            spatial_merge_size=2,
            temporal_patch_size=2,
            in_chans=3,
        ),
        image_token_id=pad,
        vision_start_token_id=start,
        vision_end_token_id=end,
    )
    model = Qwen2VLForConditionalGeneration(cfg).eval()
    builder = TemplateBuilder(tok, max_length=256, default_budget=4, slot_tokens=4, field_blocks=True)
    model.resize_token_embeddings(len(tok))
    # a 56x56 image: 4x4 patches of 14 px, merged 2x2 → 4 image tokens
    grid = torch.tensor([[1, 4, 4]])
    image = [start] + [pad] * 4 + [end]
    return model, builder, image, grid


def _inputs(builder, image, text="apple berry\ncedar 9/1"):
    enc = builder.pip(text, SCHEMA, image=image)
    ids = torch.tensor([enc.input_ids])
    return enc, ids, torch.ones_like(ids)


def _logits(model, enc, ids, attn, pixels, grid, keep=None):
    keep = keep if keep is not None else torch.ones_like(ids, dtype=torch.bool)
    return pip_forward(
        model,
        ids,
        attn,
        _block_ids([enc], ids.shape[1]),
        keep,
        pattern="prefix_causal",
        pixel_values=pixels,
        image_grid_thw=grid,
    )


def test_vl_pip_decode_one_pass(vl):
    model, builder, image, grid = vl
    pixels = torch.randn(16, 3 * 2 * 14 * 14)
    calls = []
    decoder = model.model  # PIP runs the decoder (image encoder included) and applies the LM head itself
    forward = decoder.forward
    decoder.forward = lambda *a, **k: calls.append(k) or forward(*a, **k)
    try:
        out = pip_decode(
            model,
            builder,
            ["apple berry\ncedar 9/1"],
            [SCHEMA],
            images=[image],
            model_inputs=dict(pixel_values=pixels, image_grid_thw=grid),
        )
    finally:
        decoder.forward = forward
    assert len(calls) == 1 and calls[0]["position_ids"].shape[0] == 3  # explicit 3D (M-RoPE) positions
    assert list(out[0]) == ["company", "total"]


def test_vl_image_is_read_and_masks_are_bidirectional(vl):
    model, builder, image, grid = vl
    enc, ids, attn = _inputs(builder, image)
    pixels = torch.randn(16, 3 * 2 * 14 * 14)
    base = _logits(model, enc, ids, attn, pixels, grid)
    first = enc.fields[0].start
    other = _logits(model, enc, ids, attn, torch.randn(16, 3 * 2 * 14 * 14), grid)
    assert (base[first] - other[first]).abs().max() > 1e-5  # the slots see the image
    changed = ids.clone()
    changed[0, enc.fields[0].start + 3] = 7  # a later slot of the same field
    moved = _logits(model, enc, changed, attn, pixels, grid)
    assert (base[first] - moved[first]).abs().max() > 1e-5  # earlier slot sees the later one
    assert (base[: enc.prefix_len] - moved[: enc.prefix_len]).abs().max() < 1e-5  # prefix stays causal
