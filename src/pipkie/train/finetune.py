"""Entry points: `finetune` (stage 2 KV-SFT, PIP or the AR baseline) and `pretrain` (stage 1).

Both build the model the same way (base + pipkie tokens, optionally LoRA), feed the shared loop
with instances from `pipkie.train.instances`, and save a directory `load_model` reads back.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from pipkie.data import read_dataset
from pipkie.io.document import Document, serialize
from pipkie.model.copyhead import CopyHead, attach, get_head
from pipkie.model.modeling import Settings, add_tokens_to_model, builder_for, compact_config, load_model
from pipkie.model.template import SPECIAL_TOKENS, TemplateBuilder, slot_token
from pipkie.train.config import TrainConfig
from pipkie.train.instances import collate, copy_instance, kv_instance, mask_instance, random_schemas
from pipkie.train.loop import train


def load_documents(cfg: TrainConfig) -> list[Document]:
    if cfg.split == "test":
        raise ValueError("refusing to train on a test split")
    docs = list(read_dataset(cfg.dataset, cfg.data_dir, cfg.split, limit=cfg.limit or None)) if cfg.dataset else []
    if cfg.synthetic:
        from pipkie.data.synthetic import generate_receipts

        docs += list(generate_receipts(cfg.synthetic, seed=cfg.seed + 1, render=False))
    if not docs:
        raise ValueError("no training documents")
    return docs


def build_model(cfg: TrainConfig, corpus: list[str] | None = None):
    """(model, tokenizer) ready to train: the base with pipkie's tokens, LoRA-wrapped if lora_r > 0.
    New weights (a compact model, new token rows, LoRA, a copy head) are drawn from `cfg.seed`, so a
    run (and each process of a multi-process run) starts from the same weights every time."""
    import torch

    torch.manual_seed(cfg.seed)
    specials = list(SPECIAL_TOKENS) + [slot_token(j) for j in range(cfg.slot_tokens)]
    if cfg.base == "compact":
        from transformers import AutoModelForCausalLM

        from pipkie.train.tokenizer import train_tokenizer

        tokenizer = train_tokenizer(corpus or [], vocab_size=cfg.tokenizer_vocab, special=specials)
        model = AutoModelForCausalLM.from_config(compact_config(len(tokenizer), **cfg.compact))
    else:
        model, tokenizer, _ = load_model(cfg.base)
    add_tokens_to_model(model, tokenizer, cfg.slot_tokens)
    model.train()
    if cfg.init:
        model = _continue_from(cfg, model)
    elif cfg.lora_r:
        from peft import LoraConfig, get_peft_model

        new_ids = tokenizer.convert_tokens_to_ids(specials)
        lora = LoraConfig(
            r=cfg.lora_r,
            lora_alpha=cfg.lora_alpha,
            lora_dropout=0.0,
            target_modules="all-linear",
            trainable_token_indices={"embed_tokens": new_ids},
        )
        model = get_peft_model(model, lora)
    if cfg.copy_head and get_head(model) is None:  # (a stage-1 model brings its trained head)
        attach(model, CopyHead(model.config.hidden_size))
    return model, tokenizer


def _continue_from(cfg: TrainConfig, model):
    """`model` (the base with pipkie's tokens) wrapped in `cfg.init`'s trainable adapter and copy head."""
    from peft import PeftModel

    from pipkie.model.modeling import Settings

    init = Path(cfg.init)
    if not (init / "adapter_config.json").exists():
        raise ValueError(f"init={cfg.init}: not a LoRA model directory (no adapter_config.json)")
    settings = Settings.load(init)
    if settings.base not in (None, cfg.base) or settings.slot_tokens != cfg.slot_tokens:
        raise ValueError(
            f"init={cfg.init} was trained on base={settings.base!r} with slot_tokens="
            f"{settings.slot_tokens}; this config has base={cfg.base!r}, slot_tokens={cfg.slot_tokens}"
        )
    model = PeftModel.from_pretrained(model, str(init), is_trainable=True)
    if cfg.copy_head:
        if not settings.copy_head:
            raise ValueError(f"init={cfg.init} has no copy head but the config asks for one")
        head = CopyHead.load(init)
        head.learn_absent()  # (a head saved without the absent score starts it fresh)
        attach(model, head)
    return model


def _saver(cfg: TrainConfig, model, tokenizer, objective: str):
    def save(path: Path):
        path.mkdir(parents=True, exist_ok=True)
        if cfg.lora_r:
            model.save_pretrained(path, save_embedding_layers=False)
        else:  # the copy head is a submodule: it goes to its own file, not into the model's weights
            model.save_pretrained(
                path, state_dict={k: v for k, v in model.state_dict().items() if not k.startswith("pipkie_copy.")}
            )
        tokenizer.save_pretrained(path)
        if cfg.base == "compact":  # keep our trained BPE rules: without this, AutoTokenizer would pick
            _pin_tokenizer_class(path)  # the architecture's own tokenizer class on reload
        run_settings(cfg, objective).save(path)
        if cfg.copy_head:
            get_head(model).save(path)

    return save


def run_settings(cfg: TrainConfig, objective: str | None = None) -> Settings:
    """The `Settings` a run saves with its model (objective: the saved model's, default the run's)."""
    objective = objective or cfg.objective
    return Settings(
        objective=objective,
        pattern=cfg.pattern if objective == "pip" else "causal",
        max_length=cfg.max_length,
        default_budget=cfg.default_budget,
        budgets=dict(cfg.budgets),
        base=cfg.base if cfg.lora_r else None,
        keys=list(cfg.keys),
        slot_tokens=cfg.slot_tokens,
        field_blocks=cfg.field_blocks,
        copy_head=cfg.copy_head,
        item_headers=cfg.item_headers,
        item_budgets=dict(cfg.item_budgets),
        item_slots=cfg.item_slots if objective == "pip" else 0,  # AR writes values out: no slots to save
    )


def template_builder(cfg: TrainConfig, tokenizer) -> TemplateBuilder:
    """The builder of a run's templates: the one its saved settings rebuild at inference."""
    return builder_for(tokenizer, run_settings(cfg))


def _pin_tokenizer_class(path: Path) -> None:
    p = path / "tokenizer_config.json"
    conf = json.loads(p.read_text())
    conf["tokenizer_class"] = "PreTrainedTokenizerFast"
    p.write_text(json.dumps(conf, indent=2))


def finetune(cfg: TrainConfig) -> dict:
    """Stage 2: answer templates of real key/values (PIP masks, or the AR baseline's answers)."""
    if cfg.objective not in ("pip", "ar"):
        raise ValueError("finetune objective must be 'pip' or 'ar'")
    if cfg.mixture:
        return finetune_mixture(cfg)
    docs = load_documents(cfg)
    texts = [serialize(d) for d in docs]
    values = [{k: d.value(k) for k in cfg.keys} for d in docs]
    model, tokenizer = build_model(cfg, corpus=texts)
    builder = template_builder(cfg, tokenizer)
    n_blocks = cfg.templates_per_doc if cfg.pattern != "full" else 1  # packing needs a causal prefix

    def make_batch(step: int):
        rng = random.Random(cfg.seed * 1_000_003 + step)
        order = _epoch_order(len(docs), cfg.batch_size, step, cfg.seed)
        insts = []
        for i in order:
            schemas = random_schemas(cfg.keys, rng, n_blocks, cfg.key_dropout, cfg.absent_keys)
            insts.append(
                kv_instance(builder, texts[i], values[i], schemas, objective=cfg.objective, rng=rng, reveal=cfg.reveal)
            )
        return collate(insts, builder)

    pattern = cfg.pattern if cfg.objective == "pip" else "causal"
    summary = train(cfg, model, make_batch, save=_saver(cfg, model, tokenizer, cfg.objective), pattern=pattern)
    summary.update(documents=len(docs), objective=cfg.objective, base=cfg.base)
    Path(cfg.output_dir, "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def inference_budgets(cfg: TrainConfig) -> dict[str, int]:
    """Slots per key name saved with a mixture-trained model: every alias of a canonical key gets its
    budget (pipkie.train.keys), the config's own budgets win."""
    from pipkie.train.keys import ALIASES, BUDGETS, DEFAULT_BUDGET

    out: dict[str, int] = {}
    for canonical, names in ALIASES.items():
        for name in (canonical, *names):
            out.setdefault(name, BUDGETS.get(canonical, DEFAULT_BUDGET))
    return {**out, **cfg.budgets}


def finetune_mixture(cfg: TrainConfig) -> dict:
    """Stage 2 on a mixture of sources (pipkie.train.mixture): varied documents, keys and key names.

    PIP and AR runs of one config draw the very same documents and templates at every step (the
    batch is a function of seed and step, and no draw depends on the objective), so the AR baseline
    is trained on exactly what the PIP model is."""
    from pipkie.train.keys import item_alias_budgets
    from pipkie.train.mixture import Mixture, item_share, templates

    mixture = Mixture.from_config(cfg.mixture, seed=cfg.seed)
    # only the compact track trains a tokenizer (on a sample of the mixture's fixed documents)
    corpus = [serialize(d) for s in mixture.sources if s.docs for d in s.docs[:200]] if cfg.base == "compact" else None
    model, tokenizer = build_model(cfg, corpus=corpus)
    # saved with the model, for every alias of a key and of a list field
    saved = {"budgets": inference_budgets(cfg), "item_budgets": item_alias_budgets(cfg.item_budgets)}
    cfg_saved = TrainConfig(**{**cfg.to_dict(), **saved})
    builder = template_builder(cfg_saved, tokenizer)
    n_blocks = cfg.templates_per_doc if cfg.pattern != "full" else 1
    value_len = lambda v: len(builder._ids(" " + v))  # noqa: E731  (the same for PIP and AR)

    def make_batch(step: int):
        rng = random.Random(cfg.seed * 1_000_003 + step)
        insts = []
        for _ in range(cfg.batch_size):
            source, doc, erased = mixture.draw_document(rng)
            text = serialize(doc)
            room = None
            if item_share(source, cfg.items):  # K as the twin sized for `lists_sized_for` counts it
                room = builder.document_room(len(builder.document_ids(text)))
                room -= cfg.max_length - (cfg.lists_sized_for or cfg.max_length)
            pairs = templates(
                source,
                doc,
                rng,
                n_blocks,
                value_len=value_len,
                key_dropout=cfg.key_dropout,
                absent=cfg.absent_keys,
                variation=cfg.key_variation,
                describe=cfg.describe,
                items=cfg.items,
                item_room=room,
                erased=erased,
                item_budgets=cfg.item_budgets,
                item_slots=cfg.item_slots,
            )
            values: dict = {}
            schemas = []
            for schema, vals in pairs:  # a name bound to another value in an earlier block: drop the block
                if all(values.get(k, v) == v for k, v in vals.items()):
                    values.update(vals)
                    schemas.append(schema)
            insts.append(
                kv_instance(builder, text, values, schemas, objective=cfg.objective, rng=rng, reveal=cfg.reveal)
            )
        return collate(insts, builder)

    pattern = cfg.pattern if cfg.objective == "pip" else "causal"
    summary = train(cfg, model, make_batch, save=_saver(cfg_saved, model, tokenizer, cfg.objective), pattern=pattern)
    summary.update(
        sources=[dict(kind=s.kind, weight=s.weight, documents=s.n) for s in mixture.sources],
        objective=cfg.objective,
        base=cfg.base,
    )
    Path(cfg.output_dir, "summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def pretrain(cfg: TrainConfig) -> dict:
    """Stage 1: masked reconstruction of document text (every corpus we have, never a test split)."""
    docs = load_documents(cfg)
    texts = [serialize(d) for d in docs]
    for spec in cfg.extra_text:
        name, _, path = spec.partition(":")
        texts += [serialize(d) for d in read_dataset(name, path, "train")]
    model, tokenizer = build_model(cfg, corpus=texts)
    builder = template_builder(cfg, tokenizer)

    def make_batch(step: int):
        rng = random.Random(cfg.seed * 1_000_003 + step)
        order = _epoch_order(len(texts), cfg.batch_size, step, cfg.seed)
        insts = []
        for i in order:
            task = rng.choice(list(cfg.pretrain_tasks))
            if task == "mask":
                insts.append(mask_instance(builder, texts[i], rng=rng, ratio=tuple(cfg.mask_ratio)))
            elif task == "copy":
                insts.append(copy_instance(builder, texts[i], rng=rng))
            else:
                raise ValueError(f"unknown pretraining task {task!r} (mask or copy)")
        return collate(insts, builder)

    return train(cfg, model, make_batch, save=_saver(cfg, model, tokenizer, "pip"), pattern=cfg.pattern)


def _epoch_order(n: int, batch: int, step: int, seed: int) -> list[int]:
    """Indices of batch `step`: consecutive slices of a fresh permutation per epoch."""
    out = []
    for j in range(step * batch, (step + 1) * batch):
        epoch, i = divmod(j, n)
        perm = list(range(n))
        random.Random(seed * 7919 + epoch).shuffle(perm)
        out.append(perm[i])
    return out
