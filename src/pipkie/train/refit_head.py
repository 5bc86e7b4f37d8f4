"""Stage 2b: refit the copy head on frozen features.

The copy head (pipkie.model.copyhead) is a few hundred thousand parameters on top of the model's final
hidden states. Its span pointers learn more slowly than the model's other parameters do in a short
fine-tuning run (the first SROIE run pointed the value's end one token early). Refitting it is
cheap: the fine-tuned model runs once over each training document without gradients, the states
the head reads (document stream, slots) and the LM head's probability of each target are kept, and
the head alone is trained for many epochs on them. A held-out part of the training split reports
the mixture's NLL before and after; the test split is never read. A confidence map the model
carried (`Settings.confidence_calibration`) was fitted on the old head's confidences, so the
refitted model is written without one (refit it with `pipkie calibrate`).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from pipkie.data import read_dataset
from pipkie.io.document import serialize
from pipkie.model.copyhead import FieldSpan, field_nll_given, get_head
from pipkie.model.modeling import Settings, builder_for, load_model, write_setting
from pipkie.train.erase import maybe_erase
from pipkie.train.instances import collate, kv_instance, random_schemas
from pipkie.train.loop import forward_batch


@dataclass
class Example:
    hidden: torch.Tensor  # (1, T, H) float16: the row's final hidden states
    p_vocab: torch.Tensor  # (K,) the LM head's probability of each target
    span: FieldSpan  # row 0


@torch.no_grad()  # not inference_mode: the stored states take part in the head's backward pass
def collect(
    model, builder, texts: list[str], values: list[dict], keys: list[str], *, seed: int = 0, desc: str = "features"
) -> list[Example]:
    """One no-gradient forward pass per document (a template of every key, plus an absent key half of
    the time, as in fine-tuning) → one Example per field."""
    rng = random.Random(seed)
    head = get_head(model)
    out = []
    for text, vals in tqdm(list(zip(texts, values)), desc=desc, mininterval=5):
        schema = random_schemas(keys, rng, 1, 0.0, 0.5)
        inst = kv_instance(builder, text, vals, schema, objective="pip", rng=rng)
        batch = collate([inst], builder)
        logits, hidden, index = forward_batch(model, batch, "prefix_causal", hidden=True)
        hidden = hidden.half()
        for f in batch["copy_fields"]:
            rows = logits[index[0, f.slots]]
            p = rows.softmax(-1).gather(-1, f.targets[:, None]).squeeze(-1)
            out.append(Example(hidden, p, f))
    assert head is not None
    return out


def mean_nll(head, examples: list[Example]) -> float:
    with torch.no_grad():
        return float(torch.cat([field_nll_given(head, e.hidden.float(), e.p_vocab, e.span) for e in examples]).mean())


def refit_head(
    *,
    model: str,
    output: str,
    dataset: str = "sroie",
    data_dir: str,
    split: str = "train",
    epochs: int = 20,
    lr: float = 1e-4,
    holdout: float = 0.1,
    seed: int = 0,
    threads: int = 1,
    limit: int | None = None,
    erase: float = 0.0,
    log=print,
) -> dict:
    """Refit the copy head of `model`; write the model with the new head to `output`. `erase`: the
    share of documents with one field's words taken out, that key answering `unknown`
    (`pipkie.train.erase`): what teaches the gate that a value can be absent."""
    if split == "test":
        raise ValueError("refusing to fit on a test split")
    torch.set_num_threads(threads)
    t0 = time.time()
    net, tok, settings = load_model(model)
    head = get_head(net)
    if head is None:
        raise ValueError(f"{model} has no copy head")
    builder = builder_for(tok, settings)
    docs = list(read_dataset(dataset, data_dir, split, limit=limit))
    random.Random(seed).shuffle(docs)
    keys = list(settings.keys)
    erase_rng = random.Random(seed + 2)
    docs = [maybe_erase(d, erase_rng, erase, keys=tuple(keys))[0] for d in docs]
    texts, values = [serialize(d) for d in docs], [{k: d.value(k) for k in keys} for d in docs]
    n_val = max(1, int(len(docs) * holdout))
    val = collect(net, builder, texts[:n_val], values[:n_val], keys, seed=seed, desc="held-out features")
    train = collect(net, builder, texts[n_val:], values[n_val:], keys, seed=seed + 1, desc="training features")
    before = dict(train=mean_nll(head, train), val=mean_nll(head, val))
    log(f"copy head NLL before: train {before['train']:.4f}, held-out {before['val']:.4f}")
    head.learn_absent()  # a head saved without the absent score learns it from its fresh init
    head.train()
    # the length prior and the absent score may start from zero (a head trained before they
    # existed): a larger step for them
    prior = list(head.length.parameters()) + head.absent_parameters()
    rest = [p for p in head.parameters() if all(p is not q for q in prior)]
    opt = torch.optim.AdamW([dict(params=rest, lr=lr), dict(params=prior, lr=10 * lr)])
    rng = random.Random(seed)
    best, best_state, history = before["val"], {k: v.clone() for k, v in head.state_dict().items()}, []
    for epoch in range(epochs):
        rng.shuffle(train)
        for i in range(0, len(train), 16):
            loss = torch.cat(
                [field_nll_given(head, e.hidden.float(), e.p_vocab, e.span) for e in train[i : i + 16]]
            ).mean()
            if not torch.isfinite(loss):
                continue  # a degenerate batch (no finite likelihood): skip rather than poison the head
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)  # as in fine-tuning: span ratios are steep
            opt.step()
        v = mean_nll(head, val)
        history.append(v)
        log(f"epoch {epoch + 1}: held-out NLL {v:.4f}")
        if v < best:  # keep the epoch that generalises best (NaN never compares smaller)
            best, best_state = v, {k: t.clone() for k, t in head.state_dict().items()}
    head.load_state_dict(best_state)
    head.eval()
    after = dict(train=mean_nll(head, train), val=mean_nll(head, val))
    log(f"copy head NLL after: train {after['train']:.4f}, held-out {after['val']:.4f}")
    out = Path(output)
    if out.resolve() != Path(model).resolve():
        shutil.copytree(model, out, dirs_exist_ok=True)
    head.save(out)
    if Settings.load(out).confidence_calibration is not None:
        write_setting(out, "confidence_calibration", None)
        log("confidence_calibration removed (fitted on the old head's confidences): refit it with pipkie calibrate")
    summary = dict(
        model=model,
        output=output,
        documents=len(docs),
        held_out=n_val,
        fields=len(train) + len(val),
        epochs=epochs,
        lr=lr,
        erase=erase,
        nll_before=before,
        nll_after=after,
        held_out_history=history,
        seconds=round(time.time() - t0, 1),
    )
    (out / "headfit.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
