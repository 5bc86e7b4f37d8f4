"""Each slot's token and confidence under the copy head's mixture, with the LM head made cheap.

A slot's distribution is p(t) = A·p_lm(t) + q(t): A = g(1 − past) is the LM head's share, q the
copy's mass plus `past` on `<|pip_end|>` (`pipkie.model.copyhead.mixture`). The decoder keeps its
argmax and that token's probability. Most of the cost is the LM head's (slots × vocabulary)
product: on SROIE, 18 of the 29 ms that a pass spends after the model (73 slots × 49k tokens in
float32, about 4 GFLOP).

On a CPU with bfloat16 matrix units (AMX) that product runs ~3× faster on a bf16 copy of the head's
weights (`fast_head`: +57 MB for SmolLM2, built on first use), from `MIN_ROWS` rows on (one row,
an AR step at batch 1, gains nothing). The decision stays exactly that of float32:
- the tokens that can win get exact float32 logits, one dot product each: the LM's best by the
  bf16 logits (its `TOP_LM` best for AR rows; PIP slots take one, as a top-k over the vocabulary
  for 70 slots costs more than it saves), the copy's `TOP_COPY` likeliest tokens, the end token
  (` unknown` at a value's first slot);
- the normaliser Z = Σ exp(logit) takes those exact terms and the bf16 ones for the rest;
- bf16 logits are within a bound of float32 (the input's rounding δ moves logit t by at most
  ‖δ‖‖w_t‖, the output's rounding by 2⁻⁹|l̃_t|, accumulation is float32), which bounds Z. A row
  is *certain* when, over those bounds, its winner stays ahead of every other candidate (they
  share Z, so their order is nearly exact) and of any token outside them (bounded by the lowest
  LM candidate's logit and by what the candidates leave). A field with a slot that is not certain
  is decoded on the float32 path, as is everything where `fast_head` is None.
Reported confidences differ from float32 only through the bf16 terms of Z (the vocabulary's tail
outside the candidates); docs/RESULTS.md has the measured differences and speeds.
"""

from __future__ import annotations

import math
import os

import torch

from pipkie.model.copyhead import FieldSpan, copy_weights, mixture
from pipkie.model.modeling import VocabSlice

TOP_LM, TOP_COPY = 64, 4  # candidates per row: the LM's (AR steps: a few rows), the copy's (PIP slots)
MIN_ROWS = 4  # fewer rows: float32 (one row: 2.5 vs 2.2 ms, four: 5.8 vs 2.2 ms, SmolLM2, 2 threads)
EXACT_ENV = "PIPKIE_EXACT_HEAD"  # set to 1: always the float32 path (e.g. to compare the two)
_CACHE = "_pipkie_bf16_head"


def lm_logits(model, rows: torch.Tensor) -> torch.Tensor:
    """(n, H) final hidden states -> (n, vocab) float32 logits: the causal LM's head, as its forward
    applies it (Gemma-style soft-capping included)."""
    logits = model.get_output_embeddings()(rows).float()
    cap = getattr(model.config, "final_logit_softcapping", None)
    return torch.tanh(logits / cap) * cap if cap else logits


def _amx() -> bool:
    check = getattr(torch.cpu, "_is_amx_tile_supported", None)
    return bool(check and check())


def fast_head(model):
    """(bf16 weights (V', H), row norms (V,)) of the LM head when the bf16 route applies: a plain
    float32 `nn.Linear` without bias or soft-capping (or one padded to V' ≥ V rows by `VocabSlice`),
    on a CPU with AMX, `PIPKIE_EXACT_HEAD` unset; else None. Rebuilt when the weights change."""
    head, size = model.get_output_embeddings(), None
    if isinstance(head, VocabSlice):  # rows padded for fast GEMMs: only the first `size` are tokens
        head, size = head.head, head.size
    w = getattr(head, "weight", None)
    if (
        os.environ.get(EXACT_ENV, "") not in ("", "0")
        or type(head) is not torch.nn.Linear  # another wrapper may compute more than its weight says
        or w.dtype != torch.float32
        or w.device.type != "cpu"
        or head.bias is not None
        or getattr(model.config, "final_logit_softcapping", None)
        or not _amx()
    ):
        return None
    key = (w.data_ptr(), w._version)
    cached = getattr(model, _CACHE, None)
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, w.detach().to(torch.bfloat16), w.detach()[:size].norm(dim=-1))
        object.__setattr__(model, _CACHE, cached)  # not a module attribute: no state dict entry
    return cached[1], cached[2]


def cache_bytes(model) -> int:
    """Memory held by `fast_head`'s copy (0 before its first use)."""
    cached = getattr(model, _CACHE, None)
    return 0 if cached is None else cached[1].numel() * cached[1].element_size() + cached[2].numel() * 4


Part = tuple[int, FieldSpan, torch.Tensor, torch.Tensor, torch.Tensor]  # n slots, span, p_start, gate, past


def greedy(model, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(probability, token) of the LM head's argmax for each row of `rows` (N, H): AR decoding's
    next token, on the same head as PIP's slots (so that PIP vs AR compares decoders, not heads)."""
    fast = fast_head(model) if len(rows) >= MIN_ROWS else None
    if fast is None:
        return lm_logits(model, rows).softmax(-1).max(-1)
    conf, toks, certain = _bf16_choice(model, rows, fast, TOP_LM, None)
    if not bool(certain.all()):
        redo = (~certain).nonzero()[:, 0]
        conf[redo], toks[redo] = lm_logits(model, rows[redo]).softmax(-1).max(-1)
    return conf, toks


def choose(model, rows: torch.Tensor, parts: list[Part]) -> tuple[torch.Tensor, torch.Tensor]:
    """(confidence, token) of each row of `rows` (N, H): the slots of `parts`, each field's first n
    slots in order (N = Σ n), under the mixture's argmax."""
    starts = torch.tensor([0] + [p[0] for p in parts]).cumsum(0).tolist()
    fast = fast_head(model) if len(rows) >= MIN_ROWS else None
    todo = list(range(len(parts)))
    if fast is not None:
        # one LM candidate per slot: a top-k over 49k tokens for every slot costs more than it saves
        conf, toks, certain = _bf16_choice(model, rows, fast, 1, parts)
        todo = [i for i in todo if not bool(certain[starts[i] : starts[i + 1]].all())]
    else:
        conf = torch.empty(len(rows), device=rows.device)
        toks = torch.empty(len(rows), dtype=torch.long, device=rows.device)
    if todo:
        sel = torch.cat([torch.arange(starts[i], starts[i + 1]) for i in todo])
        logits = lm_logits(model, rows[sel])
        j = 0
        for i in todo:
            n, span, p_start, gate, past = parts[i]
            c, t = mixture(logits[j : j + n], p_start, gate, past, span).max(-1)
            conf[starts[i] : starts[i + 1]], toks[starts[i] : starts[i + 1]] = c, t
            j += n
    return conf, toks


def _copy_candidates(n, span, p_start, gate, past, lm_cand):
    """For a field's first n slots: candidate tokens (n, C) = the LM's (lm_cand, (n, k)), the tokens
    at the copy's `TOP_COPY` likeliest starts, the end token; their mass q (n, C) outside the LM
    head, and that mass in all (n,)."""
    shifted, weight = copy_weights(p_start, gate, past, span, n)  # (M, n) each
    end = span.past_tokens(n)[:, None]  # what a slot past the value says (slot 0: ` unknown` if absent)
    if len(p_start):
        top = p_start.topk(min(TOP_COPY, len(p_start))).indices
        top = torch.cat([top, top[-1:].expand(TOP_COPY - len(top))])  # a short stream: repeats (counted once)
        copied = shifted[top].T.clamp_min(0)  # (n, TOP_COPY); past the stream: token 0, a harmless extra
    else:
        copied = end.expand(n, TOP_COPY)
    cand = torch.cat([lm_cand, copied, end], 1)
    q = (weight.T[:, :, None] * (shifted.T[:, :, None] == cand[:, None, :])).sum(1)  # (n, C)
    q = q + past[:n, None] * (cand == end)
    return cand, q, weight.sum(0) + past[:n]


def _bf16_choice(model, x, fast, top_lm: int, parts: list[Part] | None):
    """(confidence, token, certain) of each row from bf16 logits (module docstring). Without
    `parts` the distribution is the LM head's alone (A = 1, q = 0)."""
    wb, wnorm = fast
    w = model.get_output_embeddings().weight
    x = x.float()
    xb = x.to(torch.bfloat16)
    approx = (xb @ wb.T).float()  # (N, V')
    approx[:, len(wnorm) :] = float("-inf")  # padding rows (VocabSlice) are not tokens
    if top_lm == 1:
        s, lm_cand = approx.max(-1)
        lm_low, lm_cand = s, lm_cand[:, None]
    else:
        top = approx.topk(top_lm, -1)
        s, lm_low, lm_cand = top.values[:, 0], top.values[:, -1], top.indices
    e = approx.sub_(s[:, None]).exp_()  # in place: exp(l̃ − s)
    e_sum = e.sum(-1)
    if parts is None:
        cand, q = lm_cand, torch.zeros(lm_cand.shape)
        total_q, a = torch.zeros(len(x)), torch.ones(len(x), 1)
    else:
        cands, qs, totals, shares, j = [], [], [], [], 0
        for n, span, p_start, gate, past in parts:
            c, q, t = _copy_candidates(n, span, p_start, gate, past, lm_cand[j : j + n])
            cands.append(c), qs.append(q), totals.append(t), shares.append(gate[:n] * (1 - past[:n]))
            j += n
        cand, q, total_q, a = torch.cat(cands), torch.cat(qs), torch.cat(totals), torch.cat(shares)[:, None]
    cand, order = cand.sort(-1)
    q = q.gather(1, order)
    keep = torch.ones_like(cand, dtype=torch.bool)
    keep[:, 1:] = cand[:, 1:] != cand[:, :-1]  # each token once
    exact = torch.einsum("nh,nch->nc", x, w[cand])  # (N, C) float32 logits of the candidates
    ec = (exact - s[:, None]).exp() * keep
    rest = (e_sum - (e.gather(1, cand) * keep).sum(-1)).clamp_min(0)  # the other tokens' bf16 terms
    # their bf16 error, for logits within 30 of the best (the others add < V e^-20): the input's
    # rounding δ moves logit t by |δ·w_t| ≤ ‖δ‖ ‖w_t‖, the output's by 2⁻⁹ |l̃| (2⁻⁸: with the
    # float32 accumulation's error, ≤ 2⁻¹⁶ ‖x‖ ‖w_t‖ for a few hundred terms, on top)
    w_max = wnorm.max()
    b = (x - xb.float()).norm(dim=-1) * w_max + 2.0**-16 * x.norm(dim=-1) * w_max + 2.0**-8 * (s.abs() + 30)
    z_c = ec.sum(-1)
    z = z_c + rest
    z_lo = z_c + rest * (-b).exp()
    z_hi = z_c + rest * b.exp() + len(wnorm) * math.exp(-20.0)
    p = (a * ec / z[:, None] + q).masked_fill(~keep, -1.0)
    best = p.argmax(-1, keepdim=True)

    def lead(zz):  # (N,) the winner's lead over every other candidate at normaliser zz
        pz = (a * ec / zz[:, None] + q).masked_fill(~keep, -1.0)
        return pz.gather(1, best)[:, 0] - pz.scatter(1, best, -1.0).amax(-1)

    # candidates share Z: each lead is linear in 1/Z, so its least over [z_lo, z_hi] is at an end
    ahead = (lead(z_lo) > 0) & (lead(z_hi) > 0)
    # any other token: its LM mass is at most that of a logit as high as the lowest LM candidate's
    # (its bf16 logit is no higher) and at most what the candidates leave; its copy mass at most
    # what the candidates leave
    e_low = (lm_low - s + b).exp()
    lm_rest = torch.minimum(e_low / z_lo, (1 - z_c / z_hi).clamp_min(0))
    hi_rest = a[:, 0] * lm_rest + (total_q - (q * keep).sum(-1)).clamp_min(0)
    least = a[:, 0] * ec.gather(1, best)[:, 0] / z_hi + q.gather(1, best)[:, 0]
    certain = ahead & (least > hi_rest)
    return p.gather(1, best)[:, 0], cand.gather(1, best)[:, 0], certain
