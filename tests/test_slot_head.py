"""The LM head's bf16 route (pipkie.decoding.slot_head): the same decisions as float32, a fallback
where bf16 cannot be sure, and the float32 route wherever it does not apply."""

from types import SimpleNamespace

import pytest
import torch

from pipkie.decoding import slot_head as S
from pipkie.model.copyhead import FieldSpan, mixture

V, H, END = 3000, 64, 7


class _LM(torch.nn.Module):
    def __init__(self, seed=0, head=None):
        super().__init__()
        torch.manual_seed(seed)
        self.lm_head = head or torch.nn.Linear(H, V, bias=False)
        self.config = SimpleNamespace(final_logit_softcapping=None)

    def get_output_embeddings(self):
        return self.lm_head


@pytest.fixture(autouse=True)
def amx(monkeypatch):
    """Every CPU runs bf16 products (only AMX makes them fast): test the route everywhere."""
    monkeypatch.setattr(S, "_amx", lambda: True)
    monkeypatch.delenv(S.EXACT_ENV, raising=False)


def _parts(seed, n_fields=4, m=60):
    g = torch.Generator().manual_seed(seed)
    stream_ids = torch.randint(0, V, (m,), generator=g)
    parts = []
    for _ in range(n_fields):
        k = int(torch.randint(1, 12, (1,), generator=g))
        p_start = (torch.randn(m, generator=g) * 4).softmax(-1)  # peaked like a trained head's
        gate = torch.rand(k, generator=g) ** 3
        past = torch.rand(k, generator=g).sort().values * (torch.rand(1, generator=g) < 0.5)
        span = FieldSpan(row=0, slots=torch.arange(k), stream=torch.arange(m), stream_ids=stream_ids, end_id=END)
        parts.append((k, span, p_start, gate, past))
    return parts


def _exact(model, rows, parts):
    logits, out, j = S.lm_logits(model, rows), [], 0
    for n, span, p_start, gate, past in parts:
        out.append(mixture(logits[j : j + n], p_start, gate, past, span).max(-1))
        j += n
    return torch.cat([c for c, _ in out]), torch.cat([t for _, t in out])


@pytest.mark.parametrize("seed", range(6))
def test_choose_makes_the_float32_decisions(seed):
    model = _LM(seed)
    parts = _parts(seed)
    rows = torch.randn(sum(p[0] for p in parts), H) * 3  # logits of a few units: peaked, as trained
    _, _, certain = S._bf16_choice(model, rows, S.fast_head(model), 1, parts)
    assert certain.float().mean() > 0.8  # the bf16 route decides, not the fallback
    conf, toks = S.choose(model, rows, parts)
    ref_conf, ref_toks = _exact(model, rows, parts)
    assert torch.equal(toks, ref_toks)
    assert torch.allclose(conf, ref_conf, atol=1e-4)


@pytest.mark.parametrize("seed", range(4))
def test_greedy_makes_the_float32_decisions(seed):
    model = _LM(seed)
    rows = torch.randn(8, H) * 12  # logits of 20-30 as a trained LM's, peaked
    assert S._bf16_choice(model, rows, S.fast_head(model), S.TOP_LM, None)[2].float().mean() >= 0.5
    conf, toks = S.greedy(model, rows)
    ref_conf, ref_toks = S.lm_logits(model, rows).softmax(-1).max(-1)
    assert torch.equal(toks, ref_toks) and torch.allclose(conf, ref_conf, atol=1e-3)


def test_near_ties_are_decided_in_float32():
    """Tokens whose logits differ far below bf16's error. Among the candidates (exact float32 logits)
    the right one wins; when more tokens tie than there are candidates, bf16 cannot know which
    are best, the row is not certain and its answer comes from float32."""
    for tied in (2, S.TOP_LM + 8):
        model = _LM(1)
        w = model.lm_head.weight.data
        w[10 : 10 + tied] = w[10]
        w[10 : 10 + tied, 0] += torch.arange(tied) * 1e-5  # token 10 + tied - 1 wins by a hair
        row = (w[10] * 4)[None].repeat(4, 1)
        row[:, 0] = row[:, 0].abs() + 1.0
        _, _, certain = S._bf16_choice(model, row, S.fast_head(model), S.TOP_LM, None)
        assert bool(certain.all()) == (tied <= S.TOP_LM)
        conf, toks = S.greedy(model, row)
        ref_conf, ref_toks = S.lm_logits(model, row).softmax(-1).max(-1)
        assert toks.tolist() == ref_toks.tolist() == [10 + tied - 1] * 4
        assert torch.allclose(conf, ref_conf, atol=1e-5)


def test_float32_route_where_bf16_does_not_apply(monkeypatch):
    model = _LM(0)
    monkeypatch.setenv(S.EXACT_ENV, "1")
    assert S.fast_head(model) is None
    monkeypatch.delenv(S.EXACT_ENV)
    monkeypatch.setattr(S, "_amx", lambda: False)
    assert S.fast_head(model) is None
    monkeypatch.setattr(S, "_amx", lambda: True)
    assert S.fast_head(_LM(0, head=torch.nn.Sequential(torch.nn.Linear(H, V, bias=False)))) is None
    assert S.fast_head(_LM(0, head=torch.nn.Linear(H, V, bias=True))) is None
    assert S.fast_head(model.to(torch.bfloat16)) is None  # a bf16 model is on its own head already


def test_the_bf16_copy_follows_the_weights():
    """Training changes the weights in place: the next decode uses the new ones."""
    model = _LM(0)
    first = S.fast_head(model)[0].clone()
    assert S.cache_bytes(model) == V * H * 2 + V * 4
    with torch.no_grad():
        model.lm_head.weight.mul_(2)
    assert torch.equal(S.fast_head(model)[0].float(), (first.float() * 2))
