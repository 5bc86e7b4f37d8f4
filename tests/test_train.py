"""Training: instances match inference inputs, stage-1 masking, and resume = uninterrupted run."""

import json
import random

import pytest
import torch

from pipkie.model.template import IGNORE, TemplateBuilder
from pipkie.schema import KeySchema
from pipkie.train.config import TrainConfig
from pipkie.train.instances import collate, copy_instance, kv_instance, mask_instance
from pipkie.train.loop import train
from tests.conftest import tiny_model

TEXT = "apple berry cedar\ndelta 12/3 ember\nfrost grove 9/1"
VALUES = {"company": "apple berry", "date": "12/3", "total": None}


def test_pip_instance_block_equals_inference_template(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=4, slot_tokens=4, field_blocks=True)
    s1, s2 = KeySchema.parse("company,total"), KeySchema.parse("date")
    inst = kv_instance(b, TEXT, VALUES, [s1, s2], objective="pip", rng=random.Random(0))
    enc = b.pip(TEXT, s1, VALUES)
    n = enc.prefix_len
    assert inst.ids[: len(enc.input_ids)] == enc.input_ids  # block 1 = the inference input
    assert inst.targets[: len(enc.targets)] == enc.targets
    assert inst.pos[len(enc.input_ids)] == n  # block 2 restarts right after the prefix
    assert len(set(inst.block[n:])) == 3  # one block per field (2 + 1)


def test_ar_instance_targets_are_the_answer(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=4)
    s = KeySchema.parse("company,total")
    inst = kv_instance(b, TEXT, VALUES, [s], objective="ar", rng=random.Random(0))
    enc = b.ar(TEXT, s, VALUES)
    assert inst.ids == enc.input_ids and inst.targets == enc.targets


def test_mask_instance_masks_only_the_tail(tokenizer):
    b = TemplateBuilder(tokenizer, max_length=256)
    inst = mask_instance(b, TEXT * 3, rng=random.Random(1), ratio=(0.5, 0.5))
    n = inst.block.index(1)
    assert all(t == IGNORE for t in inst.targets[:n])
    masked = [i for i, t in enumerate(inst.targets) if t != IGNORE]
    assert masked and all(inst.ids[i] == b.mask_id for i in masked)


class Killed(Exception):
    pass


def _run(tokenizer, out, steps, every, kill_at=None):
    torch.manual_seed(0)
    model = tiny_model(tokenizer, "llama").train()
    b = TemplateBuilder(tokenizer, max_length=128, default_budget=4)
    cfg = TrainConfig(
        output_dir=str(out),
        steps=steps,
        batch_size=2,
        lr=1e-3,
        warmup=2,
        threads=1,
        bf16=False,
        checkpoint_every=every,
        lora_r=0,
    )

    def make_batch(step):
        if step == kill_at:
            raise Killed
        rng = random.Random(step)
        insts = [
            kv_instance(b, TEXT, VALUES, [KeySchema.parse("company,date,total")], objective="pip", rng=rng)
            for _ in range(2)
        ]
        return collate(insts, b, absent=False)

    train(cfg, model, make_batch, save=lambda p: None, pattern="prefix_causal")
    return [json.loads(line)["loss"] for line in (out / "log.jsonl").read_text().splitlines()]


def test_resume_continues_the_same_loss_curve(tokenizer, tmp_path):
    straight = _run(tokenizer, tmp_path / "a", steps=6, every=2)
    with pytest.raises(Killed):  # killed while making step 5's batch: last checkpoint is step 4
        _run(tokenizer, tmp_path / "b", steps=6, every=2, kill_at=4)
    resumed = _run(tokenizer, tmp_path / "b", steps=6, every=2)  # restarted: continues at step 5
    assert len(resumed) == 6  # the log holds steps 1-3 from before and 4-6 from after the restart
    assert resumed == pytest.approx(straight, rel=1e-5)


def test_trained_tokenizer_reloads_with_its_own_rules(tmp_path):
    """A compact model's BPE must tokenize the same after save + load (not the architecture's rules)."""
    from pipkie.model.modeling import compact_config, load_tokenizer
    from pipkie.train.finetune import _pin_tokenizer_class
    from pipkie.train.tokenizer import train_tokenizer
    from tests.conftest import corpus

    texts = corpus(300) + ["D'SARA SDN BHD", "TOTAL (RM): 12.50", "it's 9/1"]
    tok = train_tokenizer(texts, vocab_size=600)
    tok.save_pretrained(tmp_path)
    compact_config(len(tok)).save_pretrained(tmp_path)
    _pin_tokenizer_class(tmp_path)
    again = load_tokenizer(tmp_path)
    assert [again(t)["input_ids"] for t in texts] == [tok(t)["input_ids"] for t in texts]


def test_copy_instance_targets_are_the_span_after_the_key(tokenizer):
    from pipkie.train.instances import copy_instance

    b = TemplateBuilder(tokenizer, max_length=256, slot_tokens=4, field_blocks=True)
    text = "apple berry cedar delta ember frost grove harbor"
    inst = copy_instance(b, text, rng=random.Random(3), blocks=2)
    assert max(inst.block) == 2
    for blk in (1, 2):
        idx = [i for i, x in enumerate(inst.block) if x == blk]
        ids = [inst.ids[i] for i in idx]
        tg = [inst.targets[i] for i in idx if inst.targets[i] != IGNORE]
        key = tokenizer.decode(ids[: ids.index(b.slot_input(0))]).strip().rstrip(":")
        value = b.decode_value(tg)
        assert (key + " " + value) in text  # the value is the span right after the key words


def test_a_fully_finetuned_model_saves_its_copy_head_once(tokenizer, tmp_path):
    """Full fine-tuning (the compact track) saves the copy head to its own file only: the model's
    weights file stays a plain checkpoint of the architecture, and both load back."""
    from safetensors import safe_open

    from pipkie.model.copyhead import CopyHead, attach, get_head
    from pipkie.model.modeling import load_model
    from pipkie.train.config import TrainConfig
    from pipkie.train.finetune import _saver
    from tests.conftest import tiny_model

    model = tiny_model(tokenizer, slot_tokens=4)
    attach(model, CopyHead(model.config.hidden_size, dim=8))
    cfg = TrainConfig(base="somewhere", lora_r=0, copy_head=True, slot_tokens=4, field_blocks=True)
    _saver(cfg, model, tokenizer, "pip")(tmp_path)
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        assert f.keys() and not [k for k in f.keys() if k.startswith("pipkie_copy.")]
    back, _, settings = load_model(tmp_path)
    assert settings.copy_head
    for k, v in get_head(model).state_dict().items():
        assert torch.equal(v, get_head(back).state_dict()[k]), k


def test_init_continues_from_a_trained_lora_model(tokenizer, tmp_path):
    """`init`: a second round starts from the first round's adapter and copy head (not from zeros),
    keeps them trainable, and saves again an adapter of the same base; a wrong init is refused."""
    from pipkie.model.copyhead import get_head
    from pipkie.train.config import TrainConfig
    from pipkie.train.finetune import _saver, build_model
    from tests.conftest import tiny_model

    base = tmp_path / "base"
    tiny_model(tokenizer).save_pretrained(base)
    tokenizer.save_pretrained(base)
    cfg = TrainConfig(base=str(base), lora_r=4, lora_alpha=8, copy_head=True, bf16=False)
    first, tok = build_model(cfg)
    with torch.no_grad():  # as if trained: LoRA's B matrices start at zero, make them not
        for _name, p in first.named_parameters():
            if p.requires_grad:
                p.add_(0.01 * torch.randn_like(p))
    _saver(cfg, first, tok, "pip")(tmp_path / "round1")

    second, _ = build_model(TrainConfig(**{**cfg.to_dict(), "init": str(tmp_path / "round1")}))
    trained = {n: p for n, p in first.named_parameters() if p.requires_grad}
    again = {n: p for n, p in second.named_parameters() if p.requires_grad}
    lora = [n for n in trained if "lora_B" in n]
    assert lora and set(trained) == set(again)  # LoRA matrices, the new tokens' embeddings, the head
    for n in trained:
        assert torch.equal(trained[n], again[n]), n
    assert all(trained[n].abs().sum() > 0 for n in lora)
    for k, v in get_head(first).state_dict().items():
        assert torch.equal(v, get_head(second).state_dict()[k]), k
    assert all(p.requires_grad for p in get_head(second).parameters())

    with pytest.raises(ValueError, match="not a LoRA model"):
        build_model(TrainConfig(**{**cfg.to_dict(), "init": str(base)}))
    with pytest.raises(ValueError, match="slot_tokens"):
        build_model(TrainConfig(**{**cfg.to_dict(), "init": str(tmp_path / "round1"), "slot_tokens": 4}))


@pytest.mark.filterwarnings("ignore:document has")
def test_training_copy_streams_leave_out_the_cut_marker(tokenizer):
    """A document cut to fit keeps CUT_MARKER in its prefix; the copy head must never be trained to
    copy from it (inference leaves it out of the stream too)."""
    b = TemplateBuilder(tokenizer, max_length=400, default_budget=4, copy=True)
    long_text = TEXT * 40
    fit = b.fit(long_text, b.template_length(KeySchema.parse("company,date,total")))
    assert fit.seam, "the test needs a document that is cut"
    inst = kv_instance(
        b, long_text, VALUES, [KeySchema.parse("company,date,total")], objective="pip", rng=random.Random(0)
    )
    lo, hi = fit.seam
    assert inst.stream and not [p for p in inst.stream if lo <= p < hi]
    assert [p for p in inst.stream if p >= hi]  # the tail after the marker is still copyable
    inst = copy_instance(b, long_text, rng=random.Random(0))
    m = b.marker_ids
    lo = next(i for i in range(len(inst.ids)) if inst.ids[i : i + len(m)] == m)
    assert inst.stream and not [p for p in inst.stream if lo <= p < lo + len(m)]


def test_limit_trains_on_the_first_documents_only():
    from pathlib import Path

    from pipkie.train.finetune import load_documents

    cord = Path(__file__).parent / "fixtures" / "cord"
    every = load_documents(TrainConfig(dataset="cord", data_dir=str(cord), split="train"))
    first = load_documents(TrainConfig(dataset="cord", data_dir=str(cord), split="train", limit=1))
    assert len(every) == 2 and [d.id for d in first] == [every[0].id]
