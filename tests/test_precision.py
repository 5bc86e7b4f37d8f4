"""Compute precision at inference (`pipkie.model.precision`): bfloat16 layers, float32 around them."""

import pytest
import torch

from pipkie.decoding.pip import OnePass
from pipkie.model.precision import bf16_is_fast, compute_of, cpu_runs_bf16, resolve_compute, set_compute
from pipkie.model.template import TemplateBuilder
from pipkie.schema import KeySchema
from tests.conftest import tiny_model
from tests.test_extract import tiny_model_dir  # noqa: F401

DOC = "ACME STORE\n12 MAIN STREET\nTOTAL 9.90\nitem one 2.00\nitem two 7.90"


def test_bf16_only_where_it_runs_natively(monkeypatch):
    """On an AVX2-only CPU, bf16 matmuls fall back to a generic gemm (a LoRA step 15x slower): no.
    Training's autocast asks the GPU when there is one; inference (on the CPU) never does."""
    from pipkie.model import precision

    assert not cpu_runs_bf16("flags : fpu sse2 avx avx2 fma")
    assert cpu_runs_bf16("flags : fpu avx2 avx512f avx512_bf16")
    assert cpu_runs_bf16("flags : avx2 amx_bf16 amx_tile")
    monkeypatch.setattr(precision, "_cpu_runs_bf16_here", lambda: False)
    monkeypatch.setattr(precision.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(precision.torch.cuda, "is_bf16_supported", lambda: True)
    assert bf16_is_fast() and resolve_compute("auto") == "float32"


@pytest.mark.parametrize("fast", [True, False])
def test_the_default_is_bfloat16_where_it_is_fast(monkeypatch, fast):
    from pipkie.model import precision

    monkeypatch.setattr(precision, "_cpu_runs_bf16_here", lambda: fast)
    monkeypatch.delenv("PIPKIE_COMPUTE", raising=False)
    want = "bfloat16" if fast else "float32"
    assert resolve_compute(None) == resolve_compute("auto") == resolve_compute("AUTO") == want
    monkeypatch.setenv("PIPKIE_COMPUTE", "auto")
    assert resolve_compute(None) == want and resolve_compute("fp32") == "float32"
    from pipkie.serve import ServeSettings

    assert ServeSettings().compute == want and ServeSettings(compute="auto").compute == want


def test_resolve_compute_names_aliases_env_and_errors(monkeypatch):
    monkeypatch.setenv("PIPKIE_COMPUTE", "float32")
    assert resolve_compute(None) == "float32"
    assert resolve_compute("bf16") == resolve_compute("BFloat16") == "bfloat16"
    assert resolve_compute("fp32") == "float32"
    monkeypatch.setenv("PIPKIE_COMPUTE", "bf16")
    assert resolve_compute(None) == "bfloat16" and resolve_compute("float32") == "float32"  # the option wins
    with pytest.raises(ValueError, match="float16.*choose one of.*auto"):
        resolve_compute("float16")


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_bfloat16_layers_keep_float32_embeddings_and_outputs_and_undo(tokenizer, arch):
    """Layers in bf16 (half their bytes), the tied embedding / LM head and the final hidden states in
    float32; the hidden states stay close to float32's; float32 again removes the cast."""
    model = tiny_model(tokenizer, arch)
    b = TemplateBuilder(tokenizer, max_length=256, default_budget=4)
    enc = b.pip(DOC, KeySchema.parse("company,total,items[name,price]"))
    with torch.inference_mode():
        run = OnePass(model, b, [enc], pattern="prefix_causal")
        ref = run._hidden(run.ids)[0]
        layer_bytes = sum(p.numel() * p.element_size() for p in model.model.layers.parameters())
        assert set_compute(model, "bf16") == "bfloat16" == compute_of(model)
        assert sum(p.numel() * p.element_size() for p in model.model.layers.parameters()) == layer_bytes // 2
        assert model.get_input_embeddings().weight.dtype == torch.float32
        assert model.get_output_embeddings().weight.dtype == torch.float32
        h = run._hidden(run.ids)[0]
        assert h.dtype == torch.float32
        err = (h - ref).abs().max() / ref.abs().max()
        assert 0 < err < 0.05  # bf16 rounding: not the same numbers, close ones
        assert set_compute(model, "float32") == "float32" == compute_of(model)
        assert model.get_input_embeddings()._pipkie_compute_hook is None
        back = run._hidden(run.ids)[0]
        assert back.dtype == torch.float32 and (back - ref).abs().max() / ref.abs().max() < 0.05


def test_load_model_applies_compute_for_inference_only(tiny_model_dir, monkeypatch):
    from pipkie.model.modeling import load_model

    monkeypatch.delenv("PIPKIE_COMPUTE", raising=False)
    model, _, _ = load_model(tiny_model_dir, pad_vocab=True, compute="bfloat16")
    assert compute_of(model) == "bfloat16"
    monkeypatch.setenv("PIPKIE_COMPUTE", "bfloat16")
    assert compute_of(load_model(tiny_model_dir, pad_vocab=True)[0]) == "bfloat16"
    assert compute_of(load_model(tiny_model_dir)[0]) == "float32"  # training loads ignore the variable
    with pytest.raises(ValueError, match="inference"):
        load_model(tiny_model_dir, compute="bfloat16")


def test_extractor_runs_its_ar_baseline_in_the_same_precision_and_the_cli_checks_it(tiny_model_dir, monkeypatch):
    """A PIP-vs-AR comparison never mixes precisions: the AR baseline loads in the PIP model's;
    a precision that does not exist is a usage error before anything loads."""
    from typer.testing import CliRunner

    from pipkie.cli import app
    from pipkie.extract import Extractor
    from pipkie.io.document import Document
    from pipkie.serve import ServeSettings

    monkeypatch.delenv("PIPKIE_COMPUTE", raising=False)
    ex = Extractor.from_pretrained(tiny_model_dir, compute="bf16")
    ar, _ = ex.decoder("ar-free")
    assert ar is not ex.model and compute_of(ex.model) == compute_of(ar) == "bfloat16"
    for decode in ("pip", "ar-free"):
        out = ex.extract(Document("t", text="TOTAL 9.90"), keys=["total"], decode=decode)
        assert 0 <= out.fields["total"].confidence <= 1
    res = CliRunner().invoke(app, ["evaluate", "--dataset", "sroie", "--data-dir", ".", "--compute", "float16"])
    assert res.exit_code == 2 and "float16" in res.output
    assert ServeSettings.from_env({"PIPKIE_COMPUTE": "bf16"}).compute == "bfloat16"
    with pytest.raises(ValueError, match="PIPKIE_COMPUTE"):
        ServeSettings.from_env({"PIPKIE_COMPUTE": "int8"})
