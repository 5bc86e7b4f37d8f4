"""Shared fixtures: tiny random models and tokenizers (nothing is downloaded), the shared data.

The shared data (`../shared/data`, or `$PIPKIE_SHARED_DATA`) is optional on a developer's machine,
where tests that need it skip. Under `CI=true` it is required: a run without it fails at start-up
(`pytest_configure`), so a CI run can never pass by skipping the tests that read real data.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import pytest
import torch

os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inference defaults to bfloat16 where the CPU runs it natively (`pipkie.model.precision`, `auto`);
# the tests pin float32 so that one suite gives one result on any CI CPU. bfloat16 has its own tests.
os.environ.setdefault("PIPKIE_COMPUTE", "float32")
torch.set_num_threads(1)

SHARED = Path(os.environ.get("PIPKIE_SHARED_DATA") or Path(__file__).resolve().parents[1].parent / "shared" / "data")

WORDS = (
    "apple berry cedar delta ember frost grove harbor island jade kite lemon maple north ocean pearl quartz "
    "river stone tiger umber violet willow xenon yarrow zephyr"
).split()


def corpus(n: int = 200, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    return [
        " ".join(rng.choice(WORDS) for _ in range(12)) + f" {rng.randint(0, 9999)}/{rng.randint(1, 12)}"
        for _ in range(n)
    ]


@pytest.fixture(scope="session")
def tokenizer():
    from pipkie.model.template import SPECIAL_TOKENS
    from pipkie.train.tokenizer import train_tokenizer

    return train_tokenizer(
        corpus() + ["company date total address name city code amount unknown : \n"],
        vocab_size=400,
        special=list(SPECIAL_TOKENS),
    )


def tiny_model(tokenizer, arch: str = "qwen2", attn: str = "sdpa", seed: int = 0, slot_tokens: int = 0, **kw):
    from transformers import AutoModelForCausalLM

    from pipkie.model.modeling import add_tokens_to_model, compact_config

    torch.manual_seed(seed)
    from pipkie.model.template import add_special_tokens

    add_special_tokens(tokenizer, slot_tokens)
    cfg = compact_config(len(tokenizer), arch, **{**dict(hidden=64, layers=2, heads=4, ffn=128), **kw})
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn)
    add_tokens_to_model(model, tokenizer, slot_tokens)
    return model.eval()


def in_ci(env=os.environ) -> bool:
    return env.get("CI", "").strip().lower() in ("1", "true", "yes")


def missing_shared_data(path: Path = SHARED) -> str | None:
    """Why the shared data cannot be used (None when it can)."""
    return None if (Path(path) / "sroie").is_dir() else f"shared data not found at {path} (no sroie/ in it)"


def require_shared_data(path: Path = SHARED, env=os.environ) -> Path:
    """The shared data folder; without it a test skips, or fails under CI=true."""
    why = missing_shared_data(path)
    if why and in_ci(env):
        pytest.fail(f"{why}; CI=true requires it")
    if why:
        pytest.skip(why)
    return Path(path)


def pytest_configure(config):
    why = missing_shared_data()
    if why and in_ci():
        raise pytest.UsageError(f"{why}; CI=true requires it: the tests that read real data must run, not skip")


@pytest.fixture
def shared_data():
    return require_shared_data()
