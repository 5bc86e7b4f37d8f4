"""Copy head: a pointer from each field's mask slots into the document ("PIP-copy").

Plain PIP predicts slot j's token with the LM head alone, so slot j has to work out *where* in the
document the j-th token of its value sits. Small models get that position slightly wrong and write
shifted or repeated tokens (`193.00` → `19900`, `SDN SDN BHD BHD`). The copy head makes the
alignment explicit while decoding stays one forward pass with an independent argmax per slot:

- the document's *copy stream* is its tokens without the line-break tokens (lines are serialized
  with a leading space, see `TemplateBuilder(copy=True)`), so a value spanning several lines, such
  as an address, is one contiguous run of the stream, tokenized exactly as the value is;
- the field's first slot points at where its value starts:
  p_start(m) = softmax_m( q(h_slot0) · (k(h_m) + k'(h_m-1)) / sqrt(d) )  over stream positions m;
- slot j copies the token j places further: p_copy_j(v) ∝ Σ_m p_start(m) · [stream[m + j] = v]
  (over the starts m with m + j inside the stream);
- a gate mixes the copy with the LM head: g_j · p_vocab_j + (1 − g_j) · p_copy_j, g_j = σ(w · h_j);
  tokens that are not in the document (`unknown`, OCR variants of a value) come from the LM head;
- the same slot says how long the value is, given where it starts: for a start m, the value has
  length L = 1…K (K slots) with p(L | m) ∝ exp( q_end(h_slot0) · k(m + L) / sqrt(d) + prior_L ),
  where k(m + L) describes the first stream token after the value (or the end of the document) and
  prior = W h_slot0 is a length prior for the field (a date is ~11 tokens, a total ~6), or it is
  longer than its K slots (one more class, the value is cut). Slot j is past the end with
  probability past_j = Σ_m p_start(m) P(L ≤ j | m), and then emits `<|pip_end|>`:
  p_j = past_j · [v = end] + (1 − past_j) · (g_j · p_vocab_j + (1 − g_j) · p_copy_j).
  The end is scored given the start: an end pointer independent of the start puts mass before the
  start and is too flat to stop values on time.
- the key may have no value in the document (SQuAD 2.0's unanswerable question): a "no start"
  score n = q(h_slot0) · k_null / sqrt(d) + w_a · h_slot0 competes with the start scores,
  p_absent = e^n / (e^n + Σ_m e^start(m)), so a key is absent when nothing in the document looks
  like its start as much as it usually does. "No start" is scored in the starts' own space, with
  a learned null key (BERT's [CLS] answer to SQuAD 2.0), so that it grows with the query: in
  training the start scores sharpen (their log-sum-exp went from 17–34 to 30–38 in 20 steps,
  docs/RESULTS.md "Round 7a–7c") and a score outside that space was left behind.
  An absent field says `unknown` at slot 0 and `<|pip_end|>` after it, so absence folds into past:
  past_j ← p_absent + (1 − p_absent) past_j, and slot 0's past mass goes to ` unknown`
  (`FieldSpan.absent_id`) instead of the end token. Without it the gate alone would have to
  learn absence from the slot's state, and it does not: session 13 measured the gate at ~0.01 at
  a value's first slot whether the key is in the document or not (docs/RESULTS.md). List fields
  (`pipkie.decoding.items`) have their own "no more items" and do not use it.

Training maximises the likelihood of the mixture, so every start consistent with a target token
gets credit (no alignment labels are needed). h are the model's final hidden states (after its
last norm, the input of the LM head).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn as nn

COPY_FILE = "copy_head.safetensors"
MAX_LENGTH = 64  # value lengths with their own prior; longer ones share the last entry
ABSENT_OFF = -30.0  # the absent score's bias in a head saved without one: p_absent < 1e-13
ABSENT_START = 3.0  # a fresh absent score starts at p_absent = σ(−3) ≈ 0.05 (`CopyHead.learn_absent`)


class CopyHead(nn.Module):
    def __init__(self, hidden: int, dim: int = 128):
        super().__init__()
        self.hidden, self.dim = hidden, dim
        self.query = nn.Linear(hidden, dim)  # (H) -> (d): what the field's start looks like
        self.key = nn.Linear(hidden, dim)  # (H) -> (d): what each document token offers
        self.key_prev = nn.Linear(hidden, dim, bias=False)  # (H) -> (d): ... and the state before it
        self.end_query = nn.Linear(hidden, dim)  # (H) -> (d): what the first token after the value looks like
        self.gate = nn.Linear(hidden, 1)  # (H) -> 1: generate (1) or copy (0)
        self.length = nn.Linear(hidden, MAX_LENGTH + 1)  # (H) -> (1 + L): [longer than the slots, 1, 2, ...]
        self.absent = nn.Linear(hidden, 1)  # (H) -> 1: the score of "no start: the key is absent" ...
        self.null_key = nn.Parameter(torch.zeros(dim))  # (d): ... plus the query's match with a null start
        self.absent_pending = False  # `learn_absent`: the null key waits for the first field's scores
        nn.init.zeros_(self.length.weight)  # a flat prior to start from (and for heads saved without one)
        nn.init.zeros_(self.length.bias)
        nn.init.zeros_(self.absent.weight)  # e^0 against Σ e^start: p_absent ≈ 1/M to start from
        nn.init.zeros_(self.absent.bias)

    def learn_absent(self) -> None:
        """A head saved without the absent score loads with it switched off (`ABSENT_OFF`: it answers
        as it did when saved); training that should learn it starts it afresh. A trained head's start
        scores are peaked (their log-sum-exp is 17–34 on WildReceipt dev, per key), so a score that
        starts at 0 has p_absent ≈ e^-20 and no gradient: like torch's lazy modules, it is started on
        the first field it scores (`start_absent`), at that field's log-sum-exp − `ABSENT_START`."""
        if float(self.absent.bias.detach()) <= ABSENT_OFF:
            with torch.no_grad():
                self.absent.weight.zero_()
                self.absent.bias.zero_()
                self.null_key.zero_()
            self.absent_pending = True

    def absent_parameters(self) -> list[nn.Parameter]:
        return [*self.absent.parameters(), self.null_key]

    def absent_logit(self, h_first_slot: torch.Tensor) -> torch.Tensor:
        """(H,) -> () the score of "no start", against the start scores of `span_logits`."""
        h = h_first_slot.float()
        return self.absent(h)[0] + self.query(h) @ self.null_key / math.sqrt(self.dim)

    def start_absent(self, h_first_slot: torch.Tensor, start_lse: float) -> None:
        """`learn_absent`'s deferred start: the null key along this field's query, so that
        p_absent = σ(−ABSENT_START) ≈ 0.05 where the start scores' log-sum-exp is `start_lse`."""
        with torch.no_grad():
            q = self.query(h_first_slot.float())
            self.null_key.copy_(q * (start_lse - ABSENT_START) * math.sqrt(self.dim) / q.pow(2).sum().clamp_min(1e-6))
        self.absent_pending = False

    def stream_keys(self, h_stream: torch.Tensor, h_before: torch.Tensor) -> torch.Tensor:
        """(M, H), (M, H) -> (M, d): what each stream token offers as a value's start or end. h_before
        is the state of the token before each stream token: in a causal LM the state that predicts
        it, which knows the left context a value starts after (`TOTAL:`, `DATE`) and whether a line
        just ended. One row's keys serve all of its fields."""
        return self.key(h_stream.float()) + self.key_prev(h_before.float())

    def span_logits(self, h_first_slot: torch.Tensor, keys: torch.Tensor):
        """(H,), (M, d) stream keys -> (M,) start scores and (M + 1,) end scores (the last one: the
        value runs to the end of the document)."""
        start = keys @ self.query(h_first_slot.float()) / math.sqrt(self.dim)
        end = keys @ self.end_query(h_first_slot.float()) / math.sqrt(self.dim)
        return start, torch.cat([end, end.new_zeros(1)])

    def save(self, directory: str | Path) -> None:
        from safetensors.torch import save_file

        state = {k: v.detach().float().contiguous() for k, v in self.state_dict().items()}
        save_file(state, str(Path(directory, COPY_FILE)), metadata={"hidden": str(self.hidden), "dim": str(self.dim)})

    @classmethod
    def load(cls, directory: str | Path) -> CopyHead:
        from safetensors import safe_open
        from safetensors.torch import load_file

        path = str(Path(directory, COPY_FILE))
        with safe_open(path, "pt") as f:
            meta = f.metadata()
        head = cls(int(meta["hidden"]), int(meta["dim"]))
        state = load_file(path)
        missing = head.load_state_dict(state, strict=False).missing_keys
        if set(missing) - {"length.weight", "length.bias", "absent.weight", "absent.bias", "null_key"}:
            raise ValueError(f"{path}: not a pipkie copy head (missing {missing})")
        # a head saved before the length prior keeps the flat one it starts from: refit it
        # (`pipkie refit-head`) for the prior to be learned; one saved before the absent score
        # never answers absent (`learn_absent`)
        if "absent.bias" in missing:
            with torch.no_grad():
                head.absent.bias.fill_(ABSENT_OFF)
        return head.eval()


def attach(model, head: CopyHead) -> None:
    """Register the head on the model (as a submodule, so it trains, moves and checkpoints with it)."""
    model.pipkie_copy = head


def get_head(model) -> CopyHead | None:
    return getattr(model, "pipkie_copy", None)


@dataclass
class FieldSpan:
    """One field of one batch row: where its slots and the row's copy stream are."""

    row: int
    slots: torch.Tensor  # (K,) sequence positions of the value slots
    stream: torch.Tensor  # (M,) sequence positions of the document's copy-stream tokens
    stream_ids: torch.Tensor  # (M,) their token ids
    end_id: int = -1  # the token that closes a value (<|pip_end|>)
    targets: torch.Tensor | None = None  # (K,) value tokens (training)
    keys: torch.Tensor | None = None  # (M, d) the row's `CopyHead.stream_keys`, when its fields share them
    absent_id: int = -1  # ` unknown`: what slot 0 says when the key is absent; -1: no absent score (lists)
    span: int = 0  # > 0: lengths up to this many tokens, past the slots (a span field: `FieldSlots.span`)
    value: torch.Tensor | None = None  # a span field's value tokens (training: `span_nll`)

    def past_tokens(self, n: int) -> torch.Tensor:
        """(n,) the token each of the first n slots says when it is past the value: `<|pip_end|>`,
        and ` unknown` at slot 0 (where past is the key's absence)."""
        out = torch.full((n,), self.end_id, dtype=torch.long)
        if self.absent_id >= 0 and n:
            out[0] = self.absent_id
        return out


def _shifted(stream_ids: torch.Tensor, k: int) -> torch.Tensor:
    """(M,) -> (M, K): out[m, j] = stream_ids[m + j], -1 past the end."""
    padded = torch.cat([stream_ids, stream_ids.new_full((k,), -1)])
    return padded.unfold(0, k, 1)[: len(stream_ids)]


def _reach(p_start: torch.Tensor, shifted: torch.Tensor) -> torch.Tensor:
    """(K,) start mass from which slot j still lands inside the stream: slot j's copy distribution
    is renormalised over those starts."""
    return (p_start @ (shifted >= 0).float()).clamp_min(1e-12)


def start_gate_past(head: CopyHead, hidden: torch.Tensor, f: FieldSpan, allow: torch.Tensor | None = None):
    """p_start (M,), gate (K,) and past (K,): the chance that slot j lies past the value's end (or
    that the key is absent); everything the mixture needs besides the LM head. past_j > 0.5 makes
    `f.past_tokens()[j]` slot j's argmax whatever the LM head says (it has p ≥ past_j, all other
    tokens together 1 − past_j), so the decoder skips the LM head from the first such slot on.

    `allow` (M,) bool: the value starts only where it is True (p_start is 0 elsewhere, renormalised),
    as item i + 1 of a list starts after item i (`pipkie.decoding.items`); ignored when it allows
    nothing."""
    return copy_distributions(head, hidden, f, allow)[:3]


def copy_distributions(head: CopyHead, hidden: torch.Tensor, f: FieldSpan, allow: torch.Tensor | None = None):
    """`start_gate_past`'s three and p_len (M, K): P(value length = j + 1 | it starts at m), which a
    decoder that reads a value as one span of the document needs (`pipkie.decoding.items`)."""
    with torch.autocast(hidden.device.type, enabled=False):  # sums of probabilities: float32 throughout
        return _start_and_gate_fp32(head, hidden[f.row].float(), f, allow)


def stream_keys(head: CopyHead, h: torch.Tensor, stream: torch.Tensor) -> torch.Tensor:
    """(L, H) one row's final states, (M,) its stream positions -> (M, d) float32 stream keys."""
    with torch.autocast(h.device.type, enabled=False):
        stream = stream.to(h.device)
        return head.stream_keys(h[stream].float(), h[(stream - 1).clamp_min(0)].float())


def _start_and_gate_fp32(head: CopyHead, h: torch.Tensor, f: FieldSpan, allow: torch.Tensor | None = None):
    slots, stream = f.slots.to(h.device), f.stream.to(h.device)
    keys = f.keys if f.keys is not None else stream_keys(head, h, stream)
    start, end = head.span_logits(h[slots[0]], keys)
    m, k = len(stream), max(len(slots), f.span)  # lengths 1..k: a span field's go past its slots
    if allow is not None and bool(allow.any()):
        start = start.masked_fill(~allow.to(h.device), float("-inf"))
    p_start = start.softmax(-1)  # (M,)
    prior = head.length(h[slots[0]])  # (1 + MAX_LENGTH,)
    lengths = torch.arange(1, k + 1, device=h.device)  # (K,)
    after = torch.arange(m, device=h.device)[:, None] + lengths[None, :]  # (M, K): the end for start m, length L
    scores = end[after.clamp_max(m)] + prior[lengths.clamp_max(MAX_LENGTH)][None, :]  # (M, K)
    scores = scores.masked_fill(after > m, float("-inf"))  # cannot end past the end of the document
    longer = prior[0].expand(m, 1).masked_fill(after[:, -1:] >= m, float("-inf"))  # (M, 1): more than K tokens
    p_len = torch.cat([longer, scores], dim=1).softmax(-1)[:, 1:]  # (M, K): P(L | start m)
    # slot j is past the end when L <= j: slot 0 never is (a value has at least one token)
    cdf = torch.cat([p_len.new_zeros(m, 1), p_len.cumsum(-1)[:, :-1]], dim=1)  # (M, K)
    past = (p_start @ cdf).clamp(0.0, 1.0)
    if f.absent_id >= 0 and m:  # (an empty stream: the LM head alone, as before)
        lse = start.logsumexp(-1)
        if head.absent_pending:  # (CopyHead.learn_absent)
            head.start_absent(h[slots[0]], float(lse.detach()))
        absent = torch.sigmoid(head.absent_logit(h[slots[0]]) - lse)
        past = absent + (1 - absent) * past  # slot 0: the absence itself
    gate = torch.sigmoid(head.gate(h[slots])).squeeze(-1)  # (slots,)
    return p_start, gate, past, p_len


def field_nll(head: CopyHead, hidden: torch.Tensor, vocab_logits: torch.Tensor, f: FieldSpan) -> torch.Tensor:
    """(K,) negative log-likelihood of the field's targets under the mixture.
    vocab_logits: (K, V) LM-head logits at the field's slots."""
    targets = f.targets.to(hidden.device)
    p_vocab = vocab_logits.float().softmax(-1).gather(-1, targets[:, None]).squeeze(-1)  # (K,)
    return field_nll_given(head, hidden, p_vocab, f)


def field_nll_given(head: CopyHead, hidden: torch.Tensor, p_vocab: torch.Tensor, f: FieldSpan) -> torch.Tensor:
    """field_nll with the LM head's probability of each target given: (K,) -> (K,). A span field whose
    value is longer than its slots adds the span's NLL (`span_nll`) to slot 0's, the slot whose
    state says where the value starts and how long it is."""
    p_start, gate, past, p_len = copy_distributions(head, hidden, f)
    targets = f.targets.to(hidden.device)
    k = len(targets)
    shifted = _shifted(f.stream_ids.to(hidden.device), k)  # (M, K)
    p_copy = (p_start @ (shifted == targets[None, :]).float()) / _reach(p_start, shifted)  # (K,)
    said = f.past_tokens(k).to(targets.device)
    p = (1 - past[:k]) * (gate * p_vocab + (1 - gate) * p_copy) + past[:k] * (targets == said).float()
    nll = -p.clamp_min(1e-12).log()
    if f.value is not None and len(f.value) > k:
        nll = torch.cat([nll[:1] + span_nll(p_start, p_len, f), nll[1:]])
    return nll


def span_nll(p_start: torch.Tensor, p_len: torch.Tensor, f: FieldSpan) -> torch.Tensor:
    """() −log Σ_m p_start(m) p(L | m) [stream[m : m + L] = value]: the likelihood of a span field's
    value (L tokens, more than its slots) as one span of the document, which trains its start and
    its length together; a value the document does not spell has no span (its slots' loss alone)."""
    value = f.value.to(p_start.device)
    n = len(value)
    if n > p_len.shape[1] or n > len(f.stream_ids):
        return p_start.new_zeros(())
    match = (_shifted(f.stream_ids.to(p_start.device), n) == value[None, :]).all(-1)  # (M,)
    if not bool(match.any()):
        return p_start.new_zeros(())
    return -(p_start[match] * p_len[match, n - 1]).sum().clamp_min(1e-12).log()


def field_probs(head: CopyHead, hidden: torch.Tensor, vocab_logits: torch.Tensor, f: FieldSpan) -> torch.Tensor:
    """(K, V) mixture distribution of each slot of the field."""
    return mixture(vocab_logits, *start_gate_past(head, hidden, f), f)


def mixture(
    vocab_logits: torch.Tensor, p_start: torch.Tensor, gate: torch.Tensor, past: torch.Tensor, f: FieldSpan
) -> torch.Tensor:
    """(n, V) mixture of the field's first n slots, n = len(vocab_logits) ≤ K (their LM-head logits);
    vocab_logits (float32) is consumed."""
    n = len(vocab_logits)
    # in place on one (n, V) matrix: with a 50k vocabulary each extra copy is 200 kB per slot
    probs = vocab_logits.float().softmax(-1).mul_((gate[:n] * (1 - past[:n]))[:, None])
    shifted, weight = copy_weights(p_start, gate, past, f, n)
    valid = shifted >= 0
    cols = torch.arange(n, device=probs.device).expand_as(shifted)
    probs.index_put_((cols[valid], shifted[valid]), weight[valid], accumulate=True)
    probs[torch.arange(n), f.past_tokens(n).to(probs.device)] += past[:n]
    return probs


def copy_weights(p_start: torch.Tensor, gate: torch.Tensor, past: torch.Tensor, f: FieldSpan, n: int):
    """(shifted, weight), both (M, n), for the field's first n slots: the token each start m puts at
    slot j (`shifted[m, j]`, −1 past the stream) and the mass that copy carries in the mixture,
    (1 − g_j)(1 − past_j) p_start(m) renormalised over the starts that reach slot j (0 where none)."""
    gate, past = gate[:n], past[:n]
    shifted = _shifted(f.stream_ids.to(p_start.device), n)
    weight = p_start[:, None] * ((1 - gate) * (1 - past) / _reach(p_start, shifted))[None, :]
    return shifted, weight.masked_fill(shifted < 0, 0.0)
