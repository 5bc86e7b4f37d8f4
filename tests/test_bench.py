"""The benchmark runs every method side by side and computes its ratios (timings never asserted)."""

import json
import time

import pytest
import torch

from pipkie.eval.bench import bench
from pipkie.eval.bench_report import markdown_table
from tests.test_extract import AR_BASELINE, BUDGETS, tiny_model_dir  # noqa: F401  (session fixture)


def test_bench_reports_every_method_and_ratio(tiny_model_dir, shared_data, tmp_path):  # noqa: F811
    out = tmp_path / "bench.json"
    result = bench(
        model_path=str(tiny_model_dir),
        dataset="sroie",
        data_dir=str(shared_data / "sroie"),
        batch_sizes=(1, 2),
        limit=2,
        threads=1,
        sweeps=False,
        json_path=str(out),
        plot_dir=str(tmp_path / "plots"),
        log=lambda *a: None,
    )
    env = json.loads(out.read_text())["env"]
    assert env["threads"] == 1 and env["ar_model"] == str((tiny_model_dir / AR_BASELINE).resolve())
    for bs in ("1", "2"):
        rows = result["batches"][bs]["methods"]
        assert set(rows) == {"floor", "pip", "pip-refine1", "pip-refine2", "ar-forced", "ar-free"}
        assert all(r["median_s"] > 0 for r in rows.values()) and rows["floor"]["tokens"] == 0
        assert 0 <= rows["pip"]["anls"] <= 1
        assert set(result["batches"][bs]["ratios"]) >= {
            "speedup_vs_ar-forced",
            "speedup_vs_ar-free",
            "floor_ratio",
            "floor_ratio_paired",
            "memory_vs_ar-free",
        }
        assert rows["pip"]["footprint_mb"] > rows["pip"]["peak_rss_mb"] >= 0  # weights + working memory
    assert "| 1 | pip |" in markdown_table(result)
    assert (tmp_path / "plots" / "bench.md").exists()


# seconds per document each method is made to take (on a fake clock), by document length
SCRIPT = {"floor": 0.8, "pip": 1.0, "pip-refine1": 1.5, "pip-refine2": 2.0, "ar-forced": 4.0, "ar-free": 5.0}
VALUES = {"company": "ACME TRADING", "date": None, "address": None, "total": "9.90"}


def test_ratios_and_tokens_per_second_match_independently_timed_regions(tiny_model_dir, shared_data, monkeypatch):  # noqa: F811
    """Each method's region is made to take a known time on a fake clock (longer documents longer),
    and every method answers the same values: the speed-ups, floor ratios (paired and of medians)
    and value tokens/s the benchmark reports must be those known numbers; PIP's unused slots and
    AR's headers and end tokens are no value tokens."""
    import pipkie.eval.bench as B
    from pipkie.decoding.results import FieldResult

    clock = [0.0]
    monkeypatch.setattr(B.time, "perf_counter", lambda: clock[0])
    weight = {}  # text -> its duration factor

    def spend(method, texts):
        clock[0] += SCRIPT[method] * sum(weight.setdefault(t, 1 + len(weight)) for t in texts)

    def answers(texts, schemas):
        return [{k: FieldResult(VALUES.get(k), 0.9) for k in s.names} for s in schemas]

    def fake_pip(model, builder, texts, schemas, refine_steps=0, **kw):
        spend("pip" if not refine_steps else f"pip-refine{refine_steps}", texts)
        return answers(texts, schemas)

    def fake_ar(model, builder, texts, schemas, mode="forced", **kw):
        spend("ar-free" if mode == "free" else "ar-forced", texts)
        return answers(texts, schemas)

    monkeypatch.setattr("pipkie.decoding.pip.pip_decode", fake_pip)
    monkeypatch.setattr("pipkie.decoding.ar.ar_decode", fake_ar)
    monkeypatch.setattr(B, "floor_pass", lambda model, builder, texts, schema: spend("floor", texts))
    result = bench(
        model_path=str(tiny_model_dir),
        dataset="sroie",
        data_dir=str(shared_data / "sroie"),
        batch_sizes=(1, 2),
        limit=4,
        threads=1,
        sweeps=False,
        log=lambda *a: None,
    )
    _, tok, settings = B.load_model(tiny_model_dir)
    b = B.builder_for(tok, settings)
    per_doc = sum(len(b._ids(" " + v)) for v in VALUES.values() if v)  # value tokens of one document
    assert per_doc < sum(BUDGETS.values())  # fewer than PIP's slots: the count is not of slots
    factors = sorted(weight.values())
    for bs in ("1", "2"):
        rows, ratios = result["batches"][bs]["methods"], result["batches"][bs]["ratios"]
        for m in ("pip", "ar-forced", "ar-free", "pip-refine2"):
            total = SCRIPT[m] * sum(factors)
            assert rows[m]["tokens"] == 4 * per_doc
            assert rows[m]["total_s"] == pytest.approx(total)
            assert rows[m]["tokens_per_s"] == pytest.approx(4 * per_doc / total)
        assert ratios["speedup_vs_ar-forced"] == pytest.approx(4.0)
        assert ratios["speedup_vs_ar-free"] == pytest.approx(5.0)
        assert ratios["speedup_vs_ar-free_paired"] == pytest.approx(5.0)
        assert ratios["floor_ratio"] == pytest.approx(1.25) and ratios["floor_ratio_paired"] == pytest.approx(1.25)
        assert ratios["ceiling_vs_ar-forced"] == pytest.approx(5.0)
    # batch 1: each document's own time; batch 2: the mean of the pair (documents in length order)
    one = result["batches"]["1"]["raw"]["pip"]["times"]
    assert sorted(one) == pytest.approx(factors)
    two = sorted(result["batches"]["2"]["raw"]["pip"]["times"])
    assert two == pytest.approx([(factors[0] + factors[1]) / 2] * 2 + [(factors[2] + factors[3]) / 2] * 2)


def test_bench_without_an_ar_baseline_is_a_clear_error(tmp_path, shared_data):
    from typer.testing import CliRunner

    from pipkie.cli import app
    from pipkie.model.modeling import NoARBaseline
    from tests.test_extract import build_tiny_model

    solo = build_tiny_model(tmp_path / "solo", ar_baseline=None)
    kw = dict(
        model_path=str(solo),
        dataset="sroie",
        data_dir=str(shared_data / "sroie"),
        batch_sizes=(1,),
        limit=1,
        threads=1,
        sweeps=False,
        log=lambda *a: None,
    )
    with pytest.raises(NoARBaseline, match="no AR baseline"):
        bench(**kw, methods=("pip", "ar-forced"))
    assert set(bench(**kw, methods=("pip",))["batches"]["1"]["methods"]) == {"floor", "pip"}  # PIP alone: fine
    res = CliRunner().invoke(
        app,
        [
            "bench",
            "--data-dir",
            str(shared_data / "sroie"),
            "--model",
            str(solo),
            "--limit",
            "1",
            "--batch",
            "1",
            "--no-sweeps",
            "--methods",
            "pip,ar-free",
        ],
    )
    assert res.exit_code == 2 and "no AR baseline" in res.stderr and "Traceback" not in res.output
    res = CliRunner().invoke(
        app, ["bench", "--data-dir", str(shared_data / "sroie"), "--model", str(solo), "--methods", "pip,beam"]
    )
    assert res.exit_code == 2 and "methods must be among" in res.output


def test_repeats_keep_each_methods_fastest_time(tiny_model_dir, shared_data, monkeypatch):  # noqa: F811
    """--repeats R: every method times each batch R times (all methods alike) and keeps the fastest."""
    import pipkie.eval.bench as B

    real, calls = B._measure, []

    def scripted(m, b, chunk, schema, name, pattern):
        _, preds, n, mb = real(m, b, chunk, schema, name, pattern)
        calls.append(name)
        k = sum(c == name for c in calls)  # 1 = warm-up, then 0.3, 0.1, 0.2 s per batch
        return [0.5, 0.3, 0.1, 0.2][(k - 1) % 4 if k == 1 else 1 + (k - 2) % 3], preds, n, mb

    monkeypatch.setattr(B, "_measure", scripted)
    result = bench(
        model_path=str(tiny_model_dir),
        dataset="sroie",
        data_dir=str(shared_data / "sroie"),
        batch_sizes=(1,),
        limit=2,
        threads=1,
        repeats=3,
        sweeps=False,
        methods=("pip", "ar-free"),
        log=lambda *a: None,
    )
    assert len(calls) == 3 * (1 + 2 * 3)  # (floor, pip, ar-free) x (warm-up + 2 documents x 3 repeats)
    assert all(result["batches"]["1"]["raw"][name]["times"] == [0.1, 0.1] for name in ("floor", "pip", "ar-free"))
    assert result["env"]["repeats"] == 3


def test_sweeps_plot(tiny_model_dir, tmp_path):  # noqa: F811
    from pipkie.eval.bench import run_sweeps
    from pipkie.eval.bench_report import plot
    from pipkie.model.modeling import builder_for, load_model

    model, tok, settings = load_model(tiny_model_dir)
    sweeps = run_sweeps(
        model,
        builder_for(tok, settings),
        settings.pattern,
        (1,),
        keys=(1, 2),
        lengths=(2, 4),
        repeats=1,
        log=lambda *a: None,
    )
    assert [p["x"] for p in sweeps["keys"]["1"]] == [1, 2]
    result = {"env": {"threads": 1, "parameters": 1e6, "documents": 0}, "batches": {}, "sweeps": sweeps}
    paths = plot(result, str(tmp_path))
    assert all(p.exists() and p.stat().st_size > 1000 for p in paths)


class Killed(Exception):
    pass


def test_a_killed_bench_resumes_where_it_stopped(tiny_model_dir, shared_data, tmp_path):  # noqa: F811
    out = tmp_path / "bench.json"
    kw = dict(
        model_path=str(tiny_model_dir),
        dataset="sroie",
        data_dir=str(shared_data / "sroie"),
        batch_sizes=(1,),
        limit=3,
        threads=1,
        sweeps=False,
        json_path=str(out),
        methods=("pip", "ar-forced"),
    )

    def dies_after_the_first_batch(msg):
        if "1/3 batches" in msg:
            raise Killed

    try:
        bench(**kw, log=dies_after_the_first_batch)
    except Killed:
        pass
    saved = (tmp_path / "bench.json.partial").read_text()
    other = []  # another set of methods is another interleaving: not resumed
    try:
        bench(**{**kw, "methods": ("pip",)}, log=lambda m: (other.append(m), dies_after_the_first_batch(m)))
    except Killed:
        pass
    assert any("another setting" in line for line in other)
    (tmp_path / "bench.json.partial").write_text(saved)
    partial = json.loads(saved)
    first = partial["batches"]["1"]
    assert first["done"] == 1 and not out.exists()
    assert all(len(first["raw"][m]["times"]) == 1 for m in ("floor", "pip", "ar-forced"))
    assert len(first["raw"]["pip"]["preds"]) == 1  # kept for the accuracy of the resumed run
    lines = []
    result = bench(**kw, log=lines.append)
    assert result["resumed"] and any("resuming" in line for line in lines)
    assert not any("1/3 batches" in line for line in lines) and any("3/3 batches" in line for line in lines)
    raw = result["batches"]["1"]["raw"]
    for m in ("floor", "pip", "ar-forced"):  # the batch measured before the kill is kept, not re-run
        assert len(raw[m]["times"]) == 3 and raw[m]["times"][0] == first["raw"][m]["times"][0]
        assert "preds" not in raw[m]
    rows = result["batches"]["1"]["methods"]
    assert set(rows) == {"floor", "pip", "ar-forced"} and 0 <= rows["pip"]["anls"] <= 1
    assert "floor_ratio" in result["batches"]["1"]["ratios"]
    assert out.exists() and not (tmp_path / "bench.json.partial").exists()


@pytest.mark.parametrize("kernel", [True, False])
def test_peak_rss_sees_a_freed_allocation(monkeypatch, kernel):
    """The peak is measured while the block runs, freed memory included: with the kernel's counter
    (Linux) and with the sampling thread (elsewhere)."""
    from pipkie.eval import memory

    if not kernel:
        monkeypatch.setattr(memory, "reset_peak", lambda: False)
    with memory.PeakRSS() as mem:
        x = torch.ones(64 * 2**20 // 4)  # 64 MB, written
        time.sleep(0.05)
        del x
    assert 50 < mem.mb < 200
    with memory.PeakRSS() as quiet:
        time.sleep(0.01)
    assert quiet.mb < 20


def test_gpu_script_runs_on_a_tiny_config(tmp_path):
    """scripts/bench_gpu.py is meant for a CUDA machine; its --tiny CPU run checks every method and
    ratio, and that pipkie's one-call PIP pass picks the same tokens as the whole-mask pass."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).parents[1] / "scripts" / "bench_gpu.py"
    spec = importlib.util.spec_from_file_location("bench_gpu", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    out = tmp_path / "gpu.json"
    result = mod.main(["--tiny", "--device", "cpu", "--repeats", "1", "--batch", "1,2", "--json", str(out)])
    assert [r["batch"] for r in result["runs"]] == [1, 2]
    for run in result["runs"]:
        assert set(run["methods"]) == {"floor", "pip", "pip-mask", "pip-split", "ar-forced", "ar-free"}
        assert all(v > 0 for v in run["ratios"].values())
        assert run["pip_agrees_with_pip_mask"] == 1.0  # float32: the same tokens
    assert json.loads(out.read_text())["runs"][0]["size"] == "tiny"
