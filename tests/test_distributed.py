"""pipkie.distributed on a local Ray instance (2 CPUs): the same rows as the one-machine pipeline on
the same small folder (text, JSON words, a corrupt image), and the same resume.

Skips where ray is not installed (the optional extra pipkie[ray]); under CI=true it must be
installed (`.ci/run` installs the extra), so CI cannot pass by skipping it."""

from __future__ import annotations

import json

import pytest

from pipkie.pipeline import expand_inputs, extract_files
from tests.conftest import in_ci
from tests.test_extract import tiny_extractor, tiny_model_dir  # noqa: F401
from tests.test_pipeline import make_folder, rows

try:
    import ray  # noqa: F401
except ImportError:
    if in_ci():
        raise
    pytest.skip(
        "ray is not installed (pip install 'pipkie[ray]', or -r requirements-ray.lock)", allow_module_level=True
    )


@pytest.fixture(scope="module")
def local_ray():
    import ray

    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, logging_level="warning")
    yield
    ray.shutdown()


def test_ray_gives_the_rows_of_the_local_pipeline_and_resumes(local_ray, tiny_extractor, tiny_model_dir, tmp_path):
    from pipkie.distributed import extract_files_ray

    folder = make_folder(tmp_path, n=5)
    (folder / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    files = expand_inputs([folder])
    local, dist = tmp_path / "local.jsonl", tmp_path / "ray.jsonl"
    list(extract_files(tiny_extractor, files, out=local, batch_size=2, window=8, progress=False))
    outcomes = list(extract_files_ray(str(tiny_model_dir), files[:4], dist, batch_size=2, window=8, progress=False))
    assert sorted(o.file for o in outcomes) == files[:4]
    again = list(extract_files_ray(str(tiny_model_dir), files, dist, batch_size=2, window=8, progress=False))
    assert sorted(o.file for o in again) == files[4:]  # resumed: only the files not yet written
    want = {r["file"]: r for r in rows(local)}
    got = {r["file"]: r for r in rows(dist)}
    assert set(got) == set(want) == {str(f) for f in files}
    broken = str(folder / "broken.png")
    assert got[broken]["code"] == want[broken]["code"] == "unreadable_document" and "fields" not in got[broken]
    for f, w in want.items():
        g = got[f]
        if "error" in w:
            continue
        assert {k: v for k, v in g.items() if k not in ("fields", "seconds")} == {
            k: v for k, v in w.items() if k not in ("fields", "seconds")
        }
        for key, field in w["fields"].items():
            assert g["fields"][key]["value"] == field["value"] and g["fields"][key]["boxes"] == field["boxes"]
            assert g["fields"][key]["confidence"] == pytest.approx(field["confidence"], abs=2e-3)
    assert json.loads(dist.read_text().splitlines()[0])["file"]  # plain JSON lines


def test_cli_extract_on_ray(local_ray, tiny_model_dir, tmp_path):
    from typer.testing import CliRunner

    from pipkie.cli import app

    folder = make_folder(tmp_path, n=3)
    out = tmp_path / "results.jsonl"
    base = ["extract", str(folder), "--model", str(tiny_model_dir), "--keys", "company,total"]
    res = CliRunner().invoke(app, [*base, "--ray", "local"])
    assert res.exit_code == 2 and "--out" in res.output  # Ray writes to a file only
    res = CliRunner().invoke(app, [*base, "--out", str(out), "--ray", "local"], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    assert sorted(r["file"] for r in rows(out)) == sorted(str(f) for f in expand_inputs([folder]))
    assert all(list(r["fields"]) == ["company", "total"] for r in rows(out))
