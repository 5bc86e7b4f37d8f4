"""Attention patterns as small named predicates, composed with transformers' masking utilities.

A predicate answers "may query position q attend to key position kv in batch row b?" (absolute
positions, cache included). transformers ORs ours with its causal predicate and ANDs the padding
mask, then materialises the mask in the format the model's attention backend wants (bool for
sdpa, additive float for eager, BlockMask for flex). No modeling code is copied or patched.

Patterns (`block_ids`: 0 for the causal prefix, k > 0 for the tokens of template block k):
- `causal`: the model as pre-trained (AR decoding, document prefill); with block ids (AR training,
  several answers packed after one document) each block is causal and blind to the other blocks.
- `prefix_causal`: prefix causal; a template block is bidirectional within itself, sees the whole
  prefix and no other block (so several blocks, packed after one document in training or one per
  field, each act as if alone). The prefix's keys/values are those of a plain causal pass, so a
  document's KV cache can be reused for any number of key sets.
- `full`: every token attends to every (non-padding) token, as in the reference work.

Lists of items (`pipkie.model.groups`): under `causal` and `prefix_causal` a *group block* (block id
above `GROUP_BLOCK`) also sees the group block just before it (`previous_group`), so item i knows
which line item i − 1 took; flat blocks and other groups stay invisible. Flat templates have no
group blocks: their masks are unchanged.

Speed: an explicit mask keeps sdpa off its causal kernel, which skips the upper triangle. Under
`prefix_causal` the prefix rows are plain causal, so `pip_sdpa_attention` (registered as the
attention implementation "pipkie_sdpa", which `enable_pip_attention` selects) runs them with the
causal kernel and only the template rows with their slice of the explicit mask, so a PIP pass costs
little more than the plain causal pass over the same tokens (the bench's floor ratio). Without the
`pip_causal_rows` argument it *is* sdpa, so AR decoding and plain passes are unchanged.

The template rows are sparse too: a template block sees the prefix, itself and (a group block) the
group just before it, so a run of template rows needs the prefix's keys and one short range of the
template's, not all of them. With `pip_row_chunks` (`template_chunks`: runs of `CHUNK_ROWS` rows,
each with that key range and its slice of the mask, made once per pass and shared by every layer)
each run attends to those keys alone: the same softmax (the keys left out are masked anyway), at a
fraction of the cost once the template is long (a receipt with 20 line items: 26 item groups, 1,200
template tokens, each run sees the prefix and ~150 template keys instead of all 1,200).
"""

from __future__ import annotations

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import (
    AttentionMaskInterface,
    and_masks,
    bidirectional_mask_function,
    causal_mask_function,
    create_causal_mask,
    eager_mask,
    or_masks,
    sdpa_mask,
)

PATTERNS = ("causal", "prefix_causal", "full")
GROUP_BLOCK = 1 << 20  # = pipkie.model.groups.GROUP_BLOCK: block ids above it are group blocks


def same_template_block(block_ids: torch.Tensor):
    """q and kv are both in the same template block (block id > 0)."""

    def predicate(b, h, q, kv):
        return (block_ids[b, q] > 0) & (block_ids[b, q] == block_ids[b, kv])

    return predicate


def previous_group(block_ids: torch.Tensor):
    """q is in a group block (id > GROUP_BLOCK) and kv in the group block before it (id one less):
    item i of a list sees item i − 1. A list's first group has no such block (its id − 1 is unused:
    `pipkie.model.groups`), nor has any flat block."""

    def predicate(b, h, q, kv):
        bq = block_ids[b, q]
        return (bq > GROUP_BLOCK) & (block_ids[b, kv] == bq - 1)

    return predicate


def isolated_template_blocks(block_ids: torch.Tensor):
    """kv is in the prefix or in q's own block (or, for a group block, in the previous group):
    several template blocks packed after one document (training) stay invisible to each other, each
    as if it were alone."""
    chain = previous_group(block_ids)

    def predicate(b, h, q, kv):
        return (block_ids[b, kv] == 0) | (block_ids[b, kv] == block_ids[b, q]) | chain(b, h, q, kv)

    return predicate


def _text_config(model):
    """The config of the model's language model (a vision-language model's text sub-config)."""
    return model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config


def extra_pattern(pattern: str, block_ids: torch.Tensor | None):
    """The predicate to OR with causal attention for a named pattern (None for plain causal)."""
    if pattern == "causal":
        return None
    if pattern == "full":
        return bidirectional_mask_function
    if pattern == "prefix_causal":
        if block_ids is None:
            raise ValueError("prefix_causal needs block_ids")
        return or_masks(same_template_block(block_ids), previous_group(block_ids))
    raise ValueError(f"unknown attention pattern {pattern!r}; choose one of {PATTERNS}")


def build_attention_mask(
    model,
    pattern: str,
    attention_mask: torch.Tensor,
    *,
    query_length: int,
    block_ids: torch.Tensor | None = None,
    cache=None,
    position_ids: torch.Tensor | None = None,
):
    """The 4D mask (or backend equivalent) for `model` and a batch of `query_length` new tokens.

    attention_mask: (batch, cache length + query_length) 1 for real tokens, 0 for padding.
    block_ids: (batch, cache length + query_length), see the module docstring.
    """
    extra = extra_pattern(pattern, block_ids)
    config = _text_config(model)
    isolate = isolated_template_blocks(block_ids) if block_ids is not None and pattern != "full" else None
    builder = {"sdpa": sdpa_mask, PIP_SDPA: sdpa_mask, "eager": eager_mask}.get(
        getattr(config, "_attn_implementation", None)
    )
    if builder is not None and (extra or isolate) and not getattr(config, "sliding_window", None):
        # Our predicates are plain tensor indexing, so they broadcast over index grids directly.
        # create_causal_mask would vmap them (it cannot know that), many times slower, a measurable
        # share of a PIP pass (`pipkie bench`'s floor ratio).
        predicate = or_masks(causal_mask_function, extra) if extra else causal_mask_function
        return builder(
            batch_size=attention_mask.shape[0],
            q_length=query_length,
            kv_length=attention_mask.shape[1],
            q_offset=cache.get_seq_length() if cache is not None else 0,
            kv_offset=0,
            mask_function=and_masks(predicate, isolate) if isolate else predicate,
            attention_mask=attention_mask.bool(),
            allow_is_causal_skip=False,
            use_vmap=False,
            dtype=model.dtype,
            device=attention_mask.device,
        )
    probe = torch.empty(attention_mask.shape[0], query_length, 1, dtype=model.dtype, device=attention_mask.device)
    return create_causal_mask(
        config=config,
        inputs_embeds=probe,
        attention_mask=attention_mask,
        cache=cache,
        position_ids=position_ids,
        or_mask_function=extra,
        and_mask_function=isolate,
        allow_is_causal_skip=False,
    )


# ---- the fast path for prefix_causal: the prefix rows on sdpa's causal kernel ----------------
PIP_SDPA = "pipkie_sdpa"


CHUNK_ROWS = 128  # template rows per sdpa call in `template_chunks` (fewer: more calls; more: wider key ranges)
WORTH_IT = 0.8  # runs are used when they attend to at most this share of the whole mask's keys


def template_chunks(mask: torch.Tensor | None, start: int, rows: int | None = None):
    """The template rows of a pass (from `start`, the first template token; no cache, so rows are
    positions) in runs of `rows` (default `CHUNK_ROWS`): [(r0, r1, lo, hi, sub)], where rows r0..r1 attend to the prefix
    [0, start) and to template keys in [lo, hi) only, and sub is their mask over those columns
    (batch, 1, r1 − r0, start + hi − lo). None when the mask is not sdpa's boolean one, there is no
    template, or the runs would attend to more than `WORTH_IT` of the keys the whole mask does (a
    flat template whose fields are one run: the copies of keys would cost without skipping any).
    Exact: every column a run may see is kept (the range spans all of them)."""
    if mask is None or mask.dtype != torch.bool or mask.dim() != 4 or not 0 < start < mask.shape[2]:
        return None
    if mask.shape[2] != mask.shape[3]:
        return None
    rows = rows or CHUNK_ROWS
    seen = mask[:, :, start:, start:].any(0).any(0)  # (template rows, template keys)
    runs = []
    for r0 in range(start, mask.shape[2], rows):
        r1 = min(r0 + rows, mask.shape[2])
        cols = seen[r0 - start : r1 - start].any(0).nonzero()
        lo, hi = (start + int(cols[0]), start + int(cols[-1]) + 1) if len(cols) else (start, start)
        runs.append((r0, r1, lo, hi))
    kept = sum((r1 - r0) * (start + hi - lo) for r0, r1, lo, hi in runs)
    if kept > WORTH_IT * (mask.shape[2] - start) * mask.shape[3]:
        return None  # short flat templates: nothing to skip, and the copies cost (SROIE: 6% slower)
    return [
        (r0, r1, lo, hi, torch.cat([mask[:, :, r0:r1, :start], mask[:, :, r0:r1, lo:hi]], dim=-1))
        for r0, r1, lo, hi in runs
    ]


def pip_sdpa_attention(
    module, query, key, value, attention_mask, *, pip_causal_rows: int = 0, pip_row_chunks=None, **kwargs
):
    """sdpa, except that the first `pip_causal_rows` query rows, which the caller guarantees are a
    plain causal prefix without padding or cache, run on the causal kernel; the remaining rows use
    their rows of `attention_mask`, or with `pip_row_chunks` (`template_chunks` of that mask) run by
    run on the keys each run may see. With chunks but no causal rows (a left-padded batch), the
    prefix rows before the first run see the prefix keys through their rows of the mask.
    query: (batch, heads, q, d); key/value: (batch, kv heads, kv, d)."""
    c = pip_causal_rows
    if (not c and not pip_row_chunks) or query.shape[2] != key.shape[2] or not getattr(module, "is_causal", True):
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    kwargs.pop("is_causal", None)
    if c:
        head, _ = sdpa_attention_forward(
            module, query[:, :, :c], key[:, :, :c], value[:, :, :c], None, is_causal=True, **kwargs
        )
    else:
        c = pip_row_chunks[0][0]
        head, _ = sdpa_attention_forward(
            module, query[:, :, :c], key[:, :, :c], value[:, :, :c], attention_mask[:, :, :c, :c], **kwargs
        )
    if pip_row_chunks:
        parts = [head]
        for r0, r1, lo, hi, sub in pip_row_chunks:
            k = torch.cat([key[:, :, :c], key[:, :, lo:hi]], dim=2)
            v = torch.cat([value[:, :, :c], value[:, :, lo:hi]], dim=2)
            part, _ = sdpa_attention_forward(module, query[:, :, r0:r1], k, v, sub, is_causal=False, **kwargs)
            parts.append(part)
        return torch.cat(parts, dim=1), None
    rest = attention_mask[:, :, c:] if attention_mask is not None else None
    tail, _ = sdpa_attention_forward(module, query[:, :, c:], key, value, rest, is_causal=False, **kwargs)
    return torch.cat([head, tail], dim=1), None  # (batch, q, heads, d)


AttentionInterface.register(PIP_SDPA, pip_sdpa_attention)
AttentionMaskInterface.register(PIP_SDPA, sdpa_mask)


def enable_pip_attention(model) -> bool:
    """Switch a text model on sdpa to "pipkie_sdpa" (same results; PIP passes get the fast path).
    Vision-language models are left alone (their vision tower must not see PIP's arguments)."""
    config = model.config
    if getattr(config, "_attn_implementation", None) != "sdpa" or config.sub_configs:
        return False
    model.set_attn_implementation(PIP_SDPA)
    return True


def template_start(model, pattern: str, block_ids: torch.Tensor | None, cache=None) -> int:
    """The first column holding a template token in any row of the batch, when the model uses
    "pipkie_sdpa" under prefix_causal with no cache; 0 otherwise (nothing for `pip_sdpa_attention` to
    split). Rows before it are prefix in every row: they never see a template key."""
    config = _text_config(model)
    if getattr(config, "_attn_implementation", None) != PIP_SDPA or pattern != "prefix_causal":
        return 0
    if block_ids is None or cache is not None:
        return 0
    templated = (block_ids > 0).any(0).nonzero()
    return int(templated[0]) if len(templated) else 0


def causal_rows(model, pattern: str, attention_mask: torch.Tensor, block_ids: torch.Tensor | None, cache=None) -> int:
    """How many leading rows `pip_sdpa_attention` may run as a plain causal pass: `template_start`
    when no row is padded; 0 otherwise (padding needs the mask)."""
    if not bool(attention_mask.all()):
        return 0
    return template_start(model, pattern, block_ids, cache)
