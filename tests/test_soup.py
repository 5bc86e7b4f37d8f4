"""pipkie soup: the mean of fine-tuned models' weights, refused where the models do not match."""

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from pipkie.model.modeling import Settings
from pipkie.train.soup import soup


def _model(
    path, scale, *, settings=None, shape=(3, 4), calibrated=False, modules=("q_proj", "v_proj"), dtype=torch.bfloat16
):
    path.mkdir(parents=True)
    s = settings or Settings(objective="pip", slot_tokens=4, copy_head=True, item_slots=2)
    if calibrated:
        s.confidence_calibration = {"method": "temperature", "T": 0.3, "fitted_on": "x", "n": 10}
    s.save(path)
    save_file(
        {"lora_A": torch.full(shape, scale, dtype=dtype), "step": torch.tensor([7])},
        path / "adapter_model.safetensors",
    )
    save_file({"query.weight": torch.full((2, 2), 2 * scale)}, path / "copy_head.safetensors", metadata={"dim": "2"})
    (path / "adapter_config.json").write_text(json.dumps({"r": 32, "lora_alpha": 64, "target_modules": list(modules)}))
    (path / "tokenizer.json").write_text("{}")
    (path / "README.md").write_text("run one")
    return path


def test_soup_is_the_weighted_mean_and_keeps_dtypes_metadata_and_files(tmp_path):
    a, b = _model(tmp_path / "a", 1.0, calibrated=True), _model(tmp_path / "b", 3.0)
    record = soup([a, b], tmp_path / "s")
    s = tmp_path / "s"
    adapter, head = load_file(s / "adapter_model.safetensors"), load_file(s / "copy_head.safetensors")
    assert adapter["lora_A"].dtype == torch.bfloat16 and torch.all(adapter["lora_A"] == 2.0)
    assert torch.equal(adapter["step"], torch.tensor([7])) and torch.all(head["query.weight"] == 4.0)
    from safetensors import safe_open

    with safe_open(s / "copy_head.safetensors", "pt") as f:
        assert f.metadata()["dim"] == "2"  # the copy head's sizes travel with it
    assert (s / "tokenizer.json").is_file() and not (s / "README.md").exists()
    settings = Settings.load(s)
    assert settings.item_slots == 2 and settings.confidence_calibration is None  # a fitted map does not carry over
    assert json.loads((s / "soup.json").read_text())["of"] == [str(a), str(b)] == record["of"]

    soup([a, b], tmp_path / "w", weights=[3, 1])  # normalised: 0.75 * 1 + 0.25 * 3
    assert torch.all(load_file(tmp_path / "w" / "adapter_model.safetensors")["lora_A"] == 1.5)


def test_a_shipped_bf16_model_soups_with_a_float32_run_of_it(tmp_path):
    """A shipped model (bf16 weights, a pointer to its AR twin) averaged with a float32 run continued
    from it: float32 out, and no AR twin carried (the soup's twin is the soup of the twins)."""
    shipped = Settings(objective="pip", slot_tokens=4, copy_head=True, item_slots=2, ar_baseline="../pipkie-ar")
    a = _model(tmp_path / "shipped", 1.0, settings=shipped, calibrated=True)
    b = _model(tmp_path / "run", 2.5, dtype=torch.float32)
    soup([a, b], tmp_path / "s")
    lora = load_file(tmp_path / "s" / "adapter_model.safetensors")["lora_A"]
    assert lora.dtype == torch.float32 and torch.all(lora == 1.75)
    assert Settings.load(tmp_path / "s").ar_baseline is None
    with pytest.raises(ValueError, match="step dtype"):  # integers must agree exactly, dtype too
        c = _model(tmp_path / "int", 1.0)
        save_file(
            {"lora_A": torch.ones(3, 4), "step": torch.tensor([7], dtype=torch.int32)}, c / "adapter_model.safetensors"
        )
        soup([a, c], tmp_path / "out")


def test_soup_refuses_models_that_do_not_match(tmp_path):
    a = _model(tmp_path / "a", 1.0)
    other = _model(tmp_path / "settings", 1.0, settings=Settings(objective="pip", slot_tokens=4, item_slots=0))
    with pytest.raises(ValueError, match="decoding settings"):
        soup([a, other], tmp_path / "out")
    with pytest.raises(ValueError, match="shape"):
        soup([a, _model(tmp_path / "shape", 1.0, shape=(4, 4))], tmp_path / "out")
    with pytest.raises(ValueError, match="one of the models"):
        soup([a, _model(tmp_path / "b", 2.0)], a)
    with pytest.raises(ValueError, match="at least two"):
        soup([a], tmp_path / "out")
    with pytest.raises(ValueError, match="not a pipkie model"):
        (tmp_path / "empty").mkdir()
        soup([a, tmp_path / "empty"], tmp_path / "out")
    with pytest.raises(ValueError, match="weights"):
        soup([a, tmp_path / "b"], tmp_path / "out", weights=[1, -1])
    with pytest.raises(ValueError, match="adapter configs"):
        soup([a, _model(tmp_path / "lora", 1.0, modules=("q_proj", "o_proj"))], tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing half-written


def test_soup_never_replaces_a_folder_that_is_not_an_earlier_soup(tmp_path):
    a, b = _model(tmp_path / "a", 1.0), _model(tmp_path / "b", 3.0)
    precious = tmp_path / "precious"
    precious.mkdir()
    (precious / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not an earlier soup"):
        soup([a, b], precious)
    assert (precious / "notes.txt").read_text() == "mine"
    soup([a, b], tmp_path / "s")
    soup([a, b], tmp_path / "s", weights=[1, 0])  # an earlier soup is replaced
    (tmp_path / "empty").mkdir()
    soup([a, b], tmp_path / "empty")  # and so is an empty folder
    assert json.loads((tmp_path / "s" / "soup.json").read_text())["weights"] == [1.0, 0.0]


def test_soup_reads_the_adapters_target_modules_as_a_set(tmp_path):
    """peft writes target_modules from a set: two runs of one config list them in any order."""
    a = _model(tmp_path / "a", 1.0, modules=("q_proj", "v_proj"))
    soup([a, _model(tmp_path / "b", 3.0, modules=("v_proj", "q_proj"))], tmp_path / "s")
    assert torch.all(load_file(tmp_path / "s" / "adapter_model.safetensors")["lora_A"] == 2.0)


def test_soup_of_a_model_with_itself_extracts_what_it_does(tmp_path):
    """End to end on the shipped model: the soup loads as a model and (the mean of equal weights
    being those weights) extracts exactly what the model does."""
    from pipkie.eval.calibration import calibrate
    from pipkie.extract import Extractor
    from pipkie.io.document import Document

    soup(["models/pipkie", "models/pipkie"], tmp_path / "s")
    doc = Document(id="t", text="CORNER MARKET\n12 MAIN STREET\n30/12/2016 12:31\nMILK 2.50\nTOTAL 2.50")
    got = Extractor.from_pretrained(tmp_path / "s").extract(doc, keys=["company", "total"])
    model = Extractor.from_pretrained("models/pipkie")
    want = model.extract(doc, keys=["company", "total"])
    assert got.values() == want.values() and want.values()["total"] == "2.50"
    cal = model.settings.confidence_calibration  # the soup reports raw confidences: it has no map
    for k, f in want.fields.items():
        assert f.confidence == pytest.approx(calibrate(got.fields[k].confidence, cal), abs=1e-3)


def test_pipkie_soup_command_writes_the_soup_and_says_why_it_cannot(tmp_path):
    from typer.testing import CliRunner

    from pipkie.cli import app

    a, b = _model(tmp_path / "a", 1.0), _model(tmp_path / "b", 3.0)
    ok = CliRunner().invoke(app, ["soup", str(a), str(b), "--out", str(tmp_path / "s"), "--weights", "1,1"])
    assert ok.exit_code == 0, ok.output
    assert json.loads(ok.stdout)["weights"] == [0.5, 0.5]
    assert torch.all(load_file(tmp_path / "s" / "adapter_model.safetensors")["lora_A"] == 2.0)
    other = _model(tmp_path / "c", 1.0, shape=(1, 4))
    bad = CliRunner().invoke(app, ["soup", str(a), str(other), "--out", str(tmp_path / "t")])
    assert bad.exit_code == 2 and "shape" in bad.output and "Traceback" not in bad.output
