"""``specdec bench --device``: models and steps on the asked device, clear errors, no CPU fallback."""

from __future__ import annotations

import json

import pytest
import torch

from specdec import cli
from specdec.bench import cli as bench_cli
from specdec.bench.models import load_bench_models, resolve_device
from specdec.errors import InvalidConfigError


def _run(capsys, *args):
    code = cli.main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.fixture
def one_gpu(monkeypatch):
    """This process "sees" one CUDA device (checks only: nothing is loaded in the tests that use it)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)


@pytest.mark.parametrize(("device", "message"), [
    ("gpu", "expected cpu, cuda or cuda:N"),
    ("cuda:x", "with N >= 0"),
    ("cuda:-1", "with N >= 0"),
    ("mps", "expected cpu, cuda or cuda:N"),
])
def test_a_bad_device_name_fails_before_any_work(capsys, no_work, device, message):
    code, _, err = _run(capsys, "--device", device)
    assert code == 2 and message in err


def test_cuda_without_a_gpu_is_an_error_not_a_cpu_run(capsys, no_work, no_gpu):
    code, _, err = _run(capsys, "--device", "cuda")
    assert code == 2 and "no CUDA device is visible" in err and "does not fall back to the CPU" in err


def test_cuda_index_beyond_the_visible_devices(capsys, no_work, one_gpu):
    code, _, err = _run(capsys, "--device", "cuda:1")
    assert code == 2 and "sees 1 CUDA device" in err


def test_workers_take_cuda_not_an_index(capsys, no_work):
    # with Ray the driver does not check the GPUs (each worker does), but an index cannot be honoured
    code, _, err = _run(capsys, "--device", "cuda:0", "--workers", "2")
    assert code == 2 and "give --device cuda" in err


def test_load_bench_models_checks_the_device_before_loading(tiny_dirs, no_gpu, monkeypatch):
    monkeypatch.setattr("specdec.bench.models._load_hf",
                        lambda *a, **k: pytest.fail("a model was loaded for a device that is not there"))
    with pytest.raises(InvalidConfigError, match="no CUDA device is visible"):
        load_bench_models(str(tiny_dirs["target"]), str(tiny_dirs["draft"]), device="cuda")


def test_resolve_device_without_the_check():
    # a Ray driver: the workers check their own GPUs
    assert resolve_device("CUDA", check=False) == "cuda"
    assert resolve_device("cuda:2", check=False) == "cuda:2"


def test_the_device_is_part_of_the_run_identity(capsys, tiny_dirs, tmp_path, monkeypatch):
    """A CPU sweep is not resumed on a GPU (timings and float rounding differ); logs written before
    --device existed (no key) still resume on the CPU."""
    out = tmp_path / "out"
    common = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
              "--methods", "sd", "--budget", "3", "--num-prompts", "1", "--max-new-tokens", "3",
              "--temperatures", "0", "--no-plots", "--out", out]
    code, _, err = _run(capsys, *common)
    assert code == 0, err
    header = json.loads((out / "runs.jsonl").read_text().splitlines()[0])
    assert "device" not in header["config"]
    assert json.loads((out / "meta.json").read_text())["device"] == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr("specdec.bench.models.load_bench_models",
                        lambda *a, **k: pytest.fail("models loaded for a refused resume"))
    code, _, err = _run(capsys, *common, "--device", "cuda")
    assert code == 2 and "device" in err and '"cuda" now' in err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run by benchmarks/gpu_check.py's bench stage)")
def test_a_sweep_on_the_gpu(capsys, tiny_dirs, tmp_path):
    """Every kind of row on the GPU: T=0 outputs equal the autoregressive baseline's, the log says cuda."""
    out = tmp_path / "out"
    code, stdout, err = _run(
        capsys, "--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
        "--methods", "sd,specinfer,sequoia,eagle2,rheo", "--budget", "6", "--depth", "3", "--num-prompts", "2",
        "--max-new-tokens", "6", "--seeds", "0", "--ignore-eos", "--no-plots", "--device", "cuda", "--out", out)
    assert code == 0, err
    assert json.loads((out / "meta.json").read_text())["device"] == "cuda"
    records = json.loads((out / "results.json").read_text())
    assert all(r["matches_autoregressive"] == 1.0 for r in records if r["temperature"] == 0 and r["kind"] == "speculative")
    assert "device: cuda" in stdout


def test_identity_without_device_for_the_cpu(tiny_dirs):
    class A:  # the parsed flags run_identity reads
        target = draft = eagle2_head = eagle3_head = "x"
        ignore_eos = False
        max_prompt_tokens = 8
        device = "cpu"

    class S:
        preset, temperatures, seeds, max_new_tokens, batch_size = "quick", (0.0,), (0,), 4, 1
        budget = "auto"
        optimum = False

    assert "device" not in bench_cli.run_identity(A, S, [], [])
    A.device = "cuda:1"
    assert bench_cli.run_identity(A, S, [], [])["device"] == "cuda"
