"""Copy head (PIP-copy): the mixture is a distribution, training and decoding agree, batching and the
cached-prefix route give the same answers, save/load round-trips, and a tiny model learns to copy."""

import random

import pytest
import torch

from pipkie.decoding.cached import encode_document, pip_decode_cached
from pipkie.decoding.pip import pip_decode
from pipkie.model.copyhead import CopyHead, FieldSpan, attach, field_nll, field_probs, get_head
from pipkie.model.template import TemplateBuilder
from pipkie.schema import KeySchema
from pipkie.train.config import TrainConfig
from pipkie.train.instances import collate, kv_instance, random_schemas
from pipkie.train.loop import loss_on_batch, train
from tests.conftest import WORDS, tiny_model

DOCS = ["apple berry cedar\ndelta 12/3 ember", "frost grove\nharbor island jade kite 9/1\nlemon maple north", "ocean"]
SCHEMA = KeySchema.parse("company,date,total")


def builder(tokenizer, **kw):
    return TemplateBuilder(
        tokenizer, max_length=160, default_budget=6, slot_tokens=6, field_blocks=True, copy=True, **kw
    )


@pytest.fixture
def setup(tokenizer):
    model = tiny_model(tokenizer, "llama", slot_tokens=6)
    torch.manual_seed(1)
    attach(model, CopyHead(model.config.hidden_size, dim=16).eval())
    return model, builder(tokenizer)


def test_copy_stream_makes_a_multiline_value_contiguous(tokenizer):
    b = builder(tokenizer)
    enc = b.pip("apple berry\ncedar delta\nember", SCHEMA)
    start, end = b.document_span(enc.prefix_len)
    stream = [enc.input_ids[p] for p in b.copy_stream(enc.input_ids, start, end)]
    value = b.value_ids("berry cedar delta", 10)  # spans two lines
    assert any(stream[i : i + len(value)] == value for i in range(len(stream)))
    assert not set(stream) & b.newline_ids


def _span(b, enc, f, targets=None):
    start, end = b.document_span(enc.prefix_len)
    stream = torch.tensor(b.copy_stream(enc.input_ids, start, end))
    return FieldSpan(
        0,
        torch.arange(f.start, f.start + f.length),
        stream,
        torch.tensor(enc.input_ids)[stream],
        b.end_id,
        None if targets is None else torch.tensor(targets),
    )


def test_mixture_is_a_distribution_and_matches_the_loss(setup):
    model, b = setup
    head = get_head(model)
    enc = b.pip(DOCS[1], SCHEMA, {"company": "harbor island", "date": "9/1", "total": None})
    out = model(input_ids=torch.tensor([enc.input_ids]), output_hidden_states=True)
    hidden, logits = out.hidden_states[-1], out.logits[0]
    for f in enc.fields:
        targets = enc.targets[f.start : f.start + f.length]
        span = _span(b, enc, f, targets)
        probs = field_probs(head, hidden, logits[f.start : f.start + f.length], span)
        assert torch.allclose(probs.sum(-1), torch.ones(f.length), atol=1e-5)
        nll = field_nll(head, hidden, logits[f.start : f.start + f.length], span)
        expected = -probs.gather(-1, torch.tensor(targets)[:, None]).squeeze(-1).log()
        assert torch.allclose(nll, expected, atol=1e-5)
    # the final hidden state is the LM head's input (so the head sees what the LM head sees)
    assert torch.allclose(model.lm_head(hidden)[0], logits, atol=1e-4)


def test_copy_puts_mass_on_document_tokens(setup):
    """With the gate closed, slot j can only emit stream[m + j] for some start m, or the end token."""
    model, b = setup
    head = get_head(model)
    with torch.no_grad():
        head.gate.weight.zero_()
        head.gate.bias.fill_(-30.0)  # always copy
    enc = b.pip(DOCS[0], SCHEMA)
    out = model(input_ids=torch.tensor([enc.input_ids]), output_hidden_states=True)
    f = enc.fields[0]
    span = _span(b, enc, f)
    probs = field_probs(head, out.hidden_states[-1], out.logits[0, f.start : f.start + f.length], span)
    for j in range(f.length):
        allowed = set(span.stream_ids[j:].tolist()) | {b.end_id}
        assert set((probs[j] > 1e-9).nonzero()[:, 0].tolist()) <= allowed


def test_batched_equals_single_and_cached_equals_uncached(setup):
    model, b = setup
    schemas = [SCHEMA, KeySchema.parse("total,address"), SCHEMA]
    batch = pip_decode(model, b, DOCS, schemas, split=False)
    for text, schema, got in zip(DOCS, schemas, batch):
        alone = pip_decode(model, b, [text], [schema], split=True)[0]
        doc = encode_document(model, b, text, reserve=64)
        cached = pip_decode_cached(model, b, doc, schema)
        for k in schema.names:
            assert got[k].tokens == alone[k].tokens == cached[k].tokens
            assert abs(got[k].confidence - cached[k].confidence) < 1e-4


def test_lm_head_runs_only_up_to_each_values_sure_end(setup, monkeypatch):
    """Lazy decoding skips the LM head from a field's first slot with past > 0.5 on (its argmax is
    the end token whatever the LM head says): fewer LM-head rows, the same values and confidences."""
    from pipkie.decoding import pip
    from pipkie.decoding.pip import OnePass
    from pipkie.decoding.results import collect as _collect

    model, b = setup
    encs = [b.pip(t, SCHEMA) for t in DOCS]
    run = OnePass(model, b, encs, pattern="prefix_causal")
    rows, orig = [], pip.choose
    monkeypatch.setattr(pip, "choose", lambda m, x, parts: (rows.append(x.shape[0]), orig(m, x, parts))[1])
    lazy, exact = run(lazy=True), run(lazy=False)
    assert rows[1] == int(run.keep.sum()) > rows[0]  # some slots were skipped
    got, want = (_collect(b, encs, t.tolist(), c.tolist()) for c, t in (lazy, exact))
    for g, w in zip(got, want):
        for k in SCHEMA.names:
            assert g[k].tokens == w[k].tokens and g[k].value == w[k].value
            assert g[k].confidence == pytest.approx(w[k].confidence, abs=1e-5)


def test_save_load_round_trip(tmp_path):
    head = CopyHead(32, dim=8)
    head.save(tmp_path)
    back = CopyHead.load(tmp_path)
    assert back.dim == 8
    for (n, a), (_, c) in zip(head.state_dict().items(), back.state_dict().items()):
        assert torch.equal(a, c), n


def test_a_head_saved_without_the_length_prior_loads_with_a_flat_one(tmp_path):
    from safetensors.torch import save_file

    head = CopyHead(32, dim=8)
    old = {k: v for k, v in head.state_dict().items() if not k.startswith("length.")}
    save_file(old, str(tmp_path / "copy_head.safetensors"), metadata={"hidden": "32", "dim": "8"})
    back = CopyHead.load(tmp_path)
    assert torch.equal(back.length.weight, torch.zeros_like(back.length.weight))
    save_file(
        {k: v for k, v in old.items() if k != "gate.bias"},
        str(tmp_path / "copy_head.safetensors"),
        metadata={"hidden": "32", "dim": "8"},
    )
    with pytest.raises(ValueError, match="gate.bias"):
        CopyHead.load(tmp_path)


@pytest.mark.parametrize(
    "start, expected",
    [(0, [0, 0, 0, 1, 1, 1]), (12, [0, 0, 0, 1, 1, 1]), (18, [0, 0.5, 1, 1, 1, 1]), (19, [0, 1, 1, 1, 1, 1])],
)
def test_the_length_prior_stops_a_value(start, expected):
    """past_j = P(value length <= j | start): with flat end scores and a prior on length 3, slots 0-2
    are inside the value and later slots past its end, wherever it starts; near the end of the
    document a value cannot be longer than what is left (20 stream tokens, 6 slots; from token 18,
    lengths 1 and 2 remain, equally likely)."""
    from pipkie.model.copyhead import start_gate_past

    head = CopyHead(16, dim=8)
    with torch.no_grad():
        for layer in (head.query, head.key, head.key_prev, head.end_query):
            layer.weight.zero_()
            if layer.bias is not None:
                layer.bias.zero_()
        head.key.weight[0, 0] = 1.0  # start score = 100 * hidden[m, 0] / sqrt(d): pinned where it is 1
        head.query.bias[0] = 100.0
        head.length.bias[3] = 40.0
    hidden = torch.zeros(1, 30, 16)
    hidden[0, start, 0] = 1.0
    span = FieldSpan(0, torch.arange(20, 26), torch.arange(0, 20), torch.arange(100, 120), end_id=5)
    p_start, _, past = start_gate_past(head, hidden, span)
    assert p_start[start] > 0.999
    assert torch.allclose(past, torch.tensor(expected, dtype=torch.float), atol=1e-3)


def test_tiny_model_learns_to_copy_values_it_never_saw(tokenizer, tmp_path):
    """Copy task: `key: value` lines with random words; the value must be copied from the document.
    After a short training the copy head reads unseen values exactly."""
    b = builder(tokenizer)
    keys = ["company", "date", "total"]

    def make_doc(rng):
        values = {k: " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) for k in keys}
        lines = [" ".join(rng.choice(WORDS) for _ in range(2)) for _ in range(2)]
        lines += [f"{k} {v}" for k, v in values.items()]
        rng.shuffle(lines)
        return "\n".join(lines), values

    torch.manual_seed(0)
    model = tiny_model(tokenizer, "llama", slot_tokens=6, layers=2).train()
    attach(model, CopyHead(model.config.hidden_size, dim=32))

    def make_batch(step):
        rng = random.Random(step)
        insts = []
        for _ in range(8):
            text, values = make_doc(rng)
            insts.append(kv_instance(b, text, values, random_schemas(keys, rng, 1, 0.0, 0.0), objective="pip", rng=rng))
        return collate(insts, b, absent=False)

    batch = make_batch(0)
    assert "copy_fields" in batch and float(loss_on_batch(model, batch, "prefix_causal")) > 0
    cfg = TrainConfig(
        output_dir=str(tmp_path),
        steps=250,
        batch_size=8,
        lr=3e-3,
        head_lr=2e-3,
        warmup=10,
        threads=1,
        bf16=False,
        checkpoint_every=1000,
        lora_r=0,
    )
    train(cfg, model, make_batch, save=lambda p: None, pattern="prefix_causal")
    rng = random.Random(10_000)
    docs = [make_doc(rng) for _ in range(20)]
    schema = KeySchema.parse(",".join(f"{k}:text" for k in keys))  # random values, of no type
    preds = pip_decode(model.eval(), b, [t for t, _ in docs], [schema] * len(docs))
    acc = sum(p[k].value == v[k] for (_, v), p in zip(docs, preds) for k in keys) / (3 * len(docs))
    print(f"copy-head field accuracy on unseen values: {acc:.3f}")
    assert acc >= 0.95  # 1.000 measured (60 fields)


def test_stage1_span_copy_trains_the_head_next_to_masked_reconstruction(setup):
    """Stage 1 with a copy head: span-copy blocks carry copy fields whose value is a run of the
    stream; a batch mixing them with masked reconstruction gets one loss over both."""
    from pipkie.train.instances import copy_instance, mask_instance

    model, b = setup
    text = "apple berry cedar delta\nember frost grove harbor\nisland jade kite lemon"
    rng = random.Random(3)
    cp = copy_instance(b, text, rng=rng, blocks=2)
    assert cp.fields and cp.stream
    stream_ids = [cp.ids[p] for p in cp.stream]
    for f in cp.fields:
        value = [cp.targets[p] for p in f.slots if cp.targets[p] != b.end_id]
        assert any(stream_ids[i : i + len(value)] == value for i in range(len(stream_ids)))
    mk = mask_instance(b, text, rng=rng, ratio=(0.5, 0.5))
    batch = collate([cp, mk], b, absent=False)
    loss = loss_on_batch(model.train(), batch, "prefix_causal")
    assert torch.isfinite(loss) and batch["keep"].sum() > sum(len(f.slots) for f in cp.fields)
    loss.backward()
    assert get_head(model).query.weight.grad is not None


def test_refit_head_on_frozen_features(tokenizer, shared_data, tmp_path):
    """Stage 2b end to end on a tiny model: features from the training split, the head refitted,
    the best held-out epoch kept, the model with its new head written and loadable."""
    from pipkie.model.modeling import Settings, load_model
    from pipkie.train.refit_head import refit_head

    model = tiny_model(tokenizer, "llama", slot_tokens=6)
    attach(model, CopyHead(model.config.hidden_size, dim=16))
    src = tmp_path / "model"
    model.save_pretrained(src)
    tokenizer.save_pretrained(src)
    Settings(
        budgets={"company": 6, "total": 6},
        slot_tokens=6,
        field_blocks=True,
        copy_head=True,
        max_length=512,
        keys=["company", "total"],
        confidence_calibration={"method": "temperature", "T": 0.5},
    ).save(src)
    get_head(model).save(src)
    lines = []
    summary = refit_head(
        model=str(src),
        output=str(tmp_path / "out"),
        data_dir=str(shared_data / "sroie"),
        limit=6,
        epochs=3,
        lr=1e-2,
        holdout=0.34,
        log=lines.append,
    )
    assert summary["held_out"] == 2 and summary["fields"] > 0 and len(summary["held_out_history"]) == 3
    assert summary["nll_after"]["val"] == pytest.approx(
        min([summary["nll_before"]["val"]] + summary["held_out_history"])
    )
    with pytest.raises(ValueError, match="test split"):
        refit_head(model=str(src), output=str(tmp_path / "x"), data_dir=str(shared_data / "sroie"), split="test")
    refit, _, settings = load_model(tmp_path / "out")
    old, new = get_head(model).state_dict(), get_head(refit).state_dict()
    assert settings.copy_head and (tmp_path / "out" / "headfit.json").exists()
    # a map fitted on the old head's confidences does not travel to the new head
    assert settings.confidence_calibration is None and any("confidence_calibration removed" in m for m in lines)
    assert summary["nll_after"]["val"] < summary["nll_before"]["val"]  # the refit helped on held-out fields
    assert any(not torch.equal(old[k], new[k]) for k in old)  # ... and the saved head is the refitted one

    # with erase, the documents' values go missing from their text and their targets are `unknown`
    from pipkie.train import refit_head as module

    seen, real = [], module.collect
    monkey = pytest.MonkeyPatch()
    monkey.setattr(
        module,
        "collect",
        lambda net, b, texts, values, *a, **k: seen.append((texts, values)) or real(net, b, texts, values, *a, **k),
    )
    try:
        refit_head(
            model=str(src),
            output=str(tmp_path / "e"),
            data_dir=str(shared_data / "sroie"),
            limit=6,
            epochs=1,
            holdout=0.34,
            erase=1.0,
            log=lines.append,
        )
    finally:
        monkey.undo()
    erased = [(t, k) for texts, values in seen for t, v in zip(texts, values) for k, x in v.items() if x is None]
    assert len(erased) >= 4  # one key of (nearly) every receipt


def test_a_later_item_starts_past_the_previous_one():
    """`allow`: the start distribution is 0 where it is False and still a distribution; a mask
    that allows nothing leaves the field as it was."""
    from pipkie.model.copyhead import start_gate_past

    torch.manual_seed(0)
    head = CopyHead(16, dim=8).eval()
    hidden = torch.randn(1, 30, 16)
    span = FieldSpan(0, torch.arange(20, 26), torch.arange(0, 20), torch.arange(100, 120), end_id=5)
    free, _, _ = start_gate_past(head, hidden, span)
    after, _, past = start_gate_past(head, hidden, span, allow=torch.arange(20) > 7)
    assert after[:8].sum() == 0 and after.sum().item() == pytest.approx(1.0, abs=1e-5)
    assert torch.allclose(after[8:], free[8:] / free[8:].sum(), atol=1e-6)
    assert torch.equal(start_gate_past(head, hidden, span, allow=torch.zeros(20, dtype=torch.bool))[0], free)
    assert ((past >= 0) & (past <= 1)).all()


def test_items_decode_in_document_order(tokenizer):
    """Two item groups of a random model: with MONOTONE_ITEMS the second item's fields point past
    the first's (here: its name starts later in the document)."""
    from pipkie.decoding.pip import OnePass, predict_slots
    from pipkie.model import groups

    model = tiny_model(tokenizer, "llama", slot_tokens=6)
    torch.manual_seed(3)
    attach(model, CopyHead(model.config.hidden_size, dim=16).eval())
    from pipkie.schema import Group, Key

    b = TemplateBuilder(tokenizer, max_length=400, default_budget=6, slot_tokens=6, field_blocks=True, copy=True)
    schema = KeySchema((), (Group("items", (Key("name"), Key("price")), 4),))
    enc = b.pip("1 apple 2.00\n2 berry 3.00\n3 cedar 4.00\n4 delta 5.00", schema)
    run = OnePass(model, b, [enc], pattern="prefix_causal")
    hidden, slots = run._hidden(run.ids)
    starts = {}
    for monotone in (False, True):
        trace = []
        groups.MONOTONE_ITEMS = monotone
        try:
            with torch.no_grad():
                _, toks = predict_slots(model, b, [enc], hidden, slots, run.offsets, trace=trace)
        finally:
            groups.MONOTONE_ITEMS = True
        offsets = torch.tensor([0] + [f.length for f in enc.fields]).cumsum(0).tolist()
        first = {f.key: o for f, o in zip(enc.fields, offsets)}  # a field's first slot in toks
        names = [f for f in enc.fields if f.group and f.field == "name"]
        kept = [f for f in names if int(toks[first[f.key]]) != b.end_id]  # past the last word: the list ends
        starts[monotone] = [int(torch.tensor(trace[0][f.key].p_start).argmax()) for f in kept]
    increasing = lambda xs: all(a < b for a, b in zip(xs, xs[1:]))  # noqa: E731
    assert len(starts[False]) >= 3 and not increasing(starts[False])  # untrained: every item on one place
    assert len(starts[True]) >= 2 and increasing(starts[True])


def _absent_setup(doc_has_value: bool):
    """A head whose start score is 10·hidden[m, 0] (a token with hidden[m, 0] = 1 looks like the
    value's start), and a row whose slot-0 state is the same whether the document has that token or
    not: only the start scores tell the two apart."""
    head = CopyHead(8, dim=4)
    with torch.no_grad():
        for layer in (head.query, head.key, head.key_prev, head.end_query, head.gate):
            layer.weight.zero_()
            if layer.bias is not None:
                layer.bias.zero_()
        head.key.weight[0, 0] = 1.0
        head.query.bias[0] = 20.0  # start score = 20 * hidden[m, 0] / sqrt(4)
        head.gate.bias.fill_(-30.0)  # copy, never the LM head
    hidden = torch.zeros(1, 20, 8)
    hidden[0, 12:, 1] = 1.0  # the slots' state (no start feature)
    if doc_has_value:
        hidden[0, 3, 0] = 1.0
    span = FieldSpan(0, torch.arange(12, 16), torch.arange(0, 10), torch.arange(100, 110), end_id=5, absent_id=7)
    return head, hidden, span


def test_an_absent_key_says_unknown_at_its_first_slot_and_ends():
    """p_absent folds into past: slot 0's past mass is ` unknown`, later slots' the end token; the
    mixture stays a distribution and the loss is its likelihood."""
    from pipkie.model.copyhead import mixture, start_gate_past

    head, hidden, span = _absent_setup(doc_has_value=False)
    with torch.no_grad():
        head.absent.bias.fill_(40.0)
    p, g, past = start_gate_past(head, hidden, span)
    probs = mixture(torch.zeros(4, 120), p, g, past, span)
    assert torch.allclose(probs.sum(-1), torch.ones(4), atol=1e-5)
    assert probs.argmax(-1).tolist() == [7, 5, 5, 5]
    targets = torch.tensor([7, 5, 5, 5])
    nll = field_nll_given_(head, hidden, torch.zeros(4), span, targets)
    assert float(nll.max()) < 1e-3
    span.absent_id = -1  # lists: no absent score, the first slot copies as before
    assert mixture(torch.zeros(4, 120), *start_gate_past(head, hidden, span), span).argmax(-1)[0] != 7


def field_nll_given_(head, hidden, p_vocab, span, targets):
    from pipkie.model.copyhead import field_nll_given

    span.targets = targets
    return field_nll_given(head, hidden, p_vocab, span)


def test_the_absent_score_learns_absence_from_how_well_the_document_matches():
    """The slot's state is identical with and without the value in the document, so a gate on that
    state cannot learn absence; the absent score competes with the start scores and does."""
    head_p, hidden_p, span_p = _absent_setup(True)
    _, hidden_a, span_a = _absent_setup(False)
    head = head_p
    opt = torch.optim.Adam(head.absent_parameters(), lr=0.1)
    present, absent = torch.tensor([103, 104, 5, 5]), torch.tensor([7, 5, 5, 5])
    for _ in range(200):
        loss = field_nll_given_(head, hidden_p, torch.zeros(4), span_p, present).sum()
        loss = loss + field_nll_given_(head, hidden_a, torch.zeros(4), span_a, absent).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
    from pipkie.model.copyhead import start_gate_past

    assert float(start_gate_past(head, hidden_a, span_a)[2][0]) > 0.9  # absent: unknown
    assert float(start_gate_past(head, hidden_p, span_p)[2][0]) < 0.1  # present: copies


def test_a_head_saved_without_the_absent_score_never_answers_absent(setup, tmp_path):
    """An older head loads with the absent score off (decoding as before it existed); `learn_absent`
    starts it fresh for training."""
    from safetensors.torch import save_file

    from pipkie.model.copyhead import ABSENT_OFF

    model, b = setup
    head = get_head(model)
    old = {k: v for k, v in head.state_dict().items() if not k.startswith("absent.")}
    save_file(old, str(tmp_path / "copy_head.safetensors"), metadata={"hidden": str(head.hidden), "dim": "16"})
    back = CopyHead.load(tmp_path)
    assert float(back.absent.bias) == ABSENT_OFF
    enc = b.pip(DOCS[0], SCHEMA)
    hidden = model(input_ids=torch.tensor([enc.input_ids]), output_hidden_states=True).hidden_states[-1]
    from pipkie.model.copyhead import start_gate_past

    with_score = _span(b, enc, enc.fields[0])
    with_score.absent_id = b.unknown_id
    without = _span(b, enc, enc.fields[0])
    assert torch.allclose(start_gate_past(back, hidden, with_score)[2], start_gate_past(back, hidden, without)[2])
    back.learn_absent()
    assert back.absent_pending
    # the first field the loss sees sets the bias: p_absent = σ(−3) there, not e^-20 (no gradient)
    from pipkie.model.copyhead import ABSENT_START, field_nll_given

    with_score.targets = torch.full((enc.fields[0].length,), b.end_id)
    field_nll_given(back, hidden, torch.zeros(enc.fields[0].length), with_score)
    assert not back.absent_pending
    p_absent = float(start_gate_past(back, hidden, with_score)[2][0])
    assert p_absent == pytest.approx(float(torch.sigmoid(torch.tensor(-ABSENT_START))), abs=1e-3)


def test_the_null_start_grows_with_the_query():
    """Started by `start_absent`, "no start" is scored in the starts' space: when training sharpens
    the query (all start scores ×2), the null score follows, and p_absent does not drift to 0 as a
    fixed score would."""
    from pipkie.model.copyhead import ABSENT_START

    head, hidden, span = _absent_setup(doc_has_value=False)
    h0 = hidden[0, 12]
    head.start_absent(h0, 10.0)
    assert float(head.absent_logit(h0)) == pytest.approx(10.0 - ABSENT_START, abs=1e-4)
    with torch.no_grad():
        head.query.bias.mul_(2.0)
    assert float(head.absent_logit(h0)) == pytest.approx(2 * (10.0 - ABSENT_START), abs=1e-3)
