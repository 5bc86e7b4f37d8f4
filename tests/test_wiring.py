"""End to end: a tiny model trained here on a synthetic KIE task, decoded PIP and AR.

Documents are shuffled `label value` lines; the model must find each requested label's value and
copy it (1-2 tokens), or answer `unknown` for a label the document lacks. Each label draws its
value's first and second token from small vocabularies of its own, so a 3-layer model learns the
task in a few hundred steps (no induction heads needed) while every part of the pipeline is used.
The same training loop, template builder and decoders as the real models are used; only the data
and the size differ.
"""

import random

import pytest
import torch

from pipkie.decoding.ar import ar_decode
from pipkie.decoding.pip import pip_decode
from pipkie.model.template import TemplateBuilder
from pipkie.schema import Key, KeySchema
from pipkie.train.config import TrainConfig
from pipkie.train.instances import collate, kv_instance
from pipkie.train.loop import train
from tests.conftest import WORDS, tiny_model

LABELS = ["name", "city", "code", "amount", "date"]
FIRST = {k: WORDS[5 * i : 5 * i + 3] for i, k in enumerate(LABELS)}
SECOND = {k: WORDS[5 * i + 3 : 5 * i + 5] for i, k in enumerate(LABELS)}


def make_doc(rng: random.Random):
    present = rng.sample(LABELS, rng.randint(3, 5))
    values = {k: rng.choice(FIRST[k]) + (" " + rng.choice(SECOND[k]) if rng.random() < 0.5 else "") for k in present}
    lines = [f"{k} {v}" for k, v in values.items()]
    rng.shuffle(lines)
    return "\n".join(lines), values


def make_schema(rng: random.Random) -> KeySchema:
    keys = rng.sample(LABELS, rng.randint(2, 5))
    return KeySchema(tuple(Key(k) for k in keys))


@pytest.fixture(scope="module")
def tokenizer():
    """A BPE tokenizer of this task's own, slot tokens included (they get random embeddings)."""
    from pipkie.model.template import SPECIAL_TOKENS, slot_token
    from pipkie.train.tokenizer import train_tokenizer
    from tests.conftest import corpus

    return train_tokenizer(
        corpus() + ["company date total address name city code amount unknown : \n"],
        vocab_size=400,
        special=list(SPECIAL_TOKENS) + [slot_token(j) for j in range(4)],
    )


def train_tiny(tokenizer, objective: str, tmp_path, steps: int):
    torch.manual_seed(0)
    builder = TemplateBuilder(tokenizer, max_length=160, default_budget=4, slot_tokens=4, field_blocks=True)
    # 160: every document fits next to its templates (at 128, 13% were cut to fit, which is not this test's subject)
    model = tiny_model(tokenizer, "qwen2", hidden=64, layers=2, heads=4, ffn=128, slot_tokens=4).train()
    cfg = TrainConfig(
        objective=objective,
        output_dir=str(tmp_path / objective),
        steps=steps,
        batch_size=16,
        lr=2e-3,
        warmup=0,
        schedule="constant",
        weight_decay=0.01,
        threads=torch.get_num_threads(),
        bf16=False,
        checkpoint_every=10_000,
        lora_r=0,
    )

    def make_batch(step):
        rng = random.Random(step)
        insts = []
        for _ in range(cfg.batch_size):
            text, values = make_doc(rng)
            insts.append(
                kv_instance(builder, text, values, [make_schema(rng), make_schema(rng)], objective=objective, rng=rng)
            )
        return collate(insts, builder)

    saved = []
    train(cfg, model, make_batch, save=saved.append, pattern="prefix_causal" if objective == "pip" else "causal")
    return model.eval(), builder


def field_accuracy(decode, n: int = 48) -> float:
    rng = random.Random(10_000)  # held-out documents (training used seeds 0..steps)
    docs = [make_doc(rng) for _ in range(n)]
    schemas = [make_schema(rng) for _ in range(n)]
    right = total = 0
    for i in range(0, n, 16):
        preds = decode([d[0] for d in docs[i : i + 16]], schemas[i : i + 16])
        for (_text, values), schema, pred in zip(docs[i : i + 16], schemas[i : i + 16], preds):
            for k in schema.names:
                right += pred[k].value == values.get(k)
                total += 1
    return right / total


@pytest.fixture(scope="module")
def tmp_module(tmp_path_factory):
    return tmp_path_factory.mktemp("wiring")


def test_pip_model_learns_the_task(tokenizer, tmp_module):
    model, b = train_tiny(tokenizer, "pip", tmp_module, steps=700)
    acc = field_accuracy(lambda texts, schemas: pip_decode(model, b, texts, schemas))
    print(f"PIP field accuracy: {acc:.3f}")
    assert acc >= 0.95


def test_ar_model_learns_the_task_both_modes(tokenizer, tmp_module):
    model, b = train_tiny(tokenizer, "ar", tmp_module, steps=700)
    accs = {
        mode: field_accuracy(lambda texts, schemas: ar_decode(model, b, texts, schemas, mode=mode))
        for mode in ("free", "forced")
    }
    print("AR field accuracy: " + ", ".join(f"{m} {a:.3f}" for m, a in accs.items()))
    assert min(accs.values()) >= 0.95
