"""The few-row kernel's first build never hangs and never publishes half a library (issue 57).

No test here compiles: ``fewrow._compile`` (the compiler) and ``fewrow._import_built`` (loading
a published library) are replaced by fakes that write and read a marker file, and the kernel
they "build" is the plain-torch reference. The goal case runs a real second process: a first
build SIGKILLed mid-compile, after which a new :class:`HFTarget` with a linear of 65,536 weights
finishes its first generation with the kernel; a live build outlasting the timeout costs one
one-line warning naming the fallback, never a hang.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

from specdec.errors import InvalidConfigError
from specdec.kernels import build_lock as bl
from specdec.kernels import fewrow
from specdec.kernels.fewrow import fewrow_available, fewrow_unavailable_reason, linear_fewrow_reference

FAKE = "fake-kernel-library"


class FakeKernel:
    calls = 0

    @classmethod
    def fewrow_linear(cls, x: torch.Tensor, packed: torch.Tensor, n_out: int) -> torch.Tensor:
        cls.calls += 1
        return linear_fewrow_reference(x, packed, n_out)


@pytest.fixture
def fake_build(monkeypatch, tmp_path) -> dict[str, Any]:
    """An empty specdec cache and a fake compiler; returns the record of the compiles."""
    cache = tmp_path / "cache"
    monkeypatch.setenv("SPECDEC_CACHE", str(cache))
    monkeypatch.setenv("SPECDEC_LINEAR_PLANS", "0")
    monkeypatch.delenv("SPECDEC_FEWROW", raising=False)
    monkeypatch.delenv(fewrow.BUILD_TIMEOUT_ENV, raising=False)
    monkeypatch.setattr(fewrow, "_module", None)
    monkeypatch.setattr(fewrow, "_reason", None)
    monkeypatch.setattr("specdec.kernels.linear._fewrow_warned", False)
    record: dict[str, Any] = {"dirs": [], "final_seen": [], "sleep": 0.0}
    name = fewrow._extension_name()
    record["folder"] = cache / "ext" / name

    def compile_(name_: str, build_dir: Path) -> Any:
        assert name_ == name
        record["dirs"].append(build_dir)
        record["final_seen"].append(record["folder"].exists())
        time.sleep(record["sleep"])
        (build_dir / f"{name}.so").write_text(FAKE)
        return FakeKernel

    def import_(name_: str, library: Path) -> Any:
        if library.read_text() != FAKE:
            raise ImportError(f"{library}: not a library")
        return FakeKernel

    monkeypatch.setattr(fewrow, "_compile", compile_)
    monkeypatch.setattr(fewrow, "_import_built", import_)
    return record


_KILLED_BUILD = """
import time
from specdec.kernels import fewrow

def slow(name, build_dir):
    (build_dir / (name + ".so")).write_text("half-writ")  # a library being linked
    print("compiling", flush=True)
    time.sleep(300)

fewrow._compile = slow
fewrow.load_fewrow()
"""


def _start_killed_build(env: dict[str, str]) -> subprocess.Popen[str]:
    """A process whose first build is under way (holding the lock, half a library in its folder)."""
    proc = subprocess.Popen([sys.executable, "-c", _KILLED_BUILD], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 1.0)
        if ready:
            line = proc.stdout.readline()
            if line.strip() == "compiling":
                return proc
            if not line and proc.poll() is not None:
                break
    proc.kill()
    raise AssertionError(f"the build process never started compiling: {proc.communicate()[1][-2000:]}")


def _tiny_target_model() -> Any:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=1024, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2)
    return transformers.LlamaForCausalLM(cfg).eval()  # its LM head: 1024 x 64 = 65,536 weights, tuned


def _first_generation(monkeypatch) -> tuple[Any, list[warnings.WarningMessage]]:
    """An HFTarget (tuning its CPU linears: the kernel's first use) and a first generation.

    The tuning is cut to 1-4 rows and one timed call per method (its full default measures 24 row
    counts five times: seconds to minutes on a loaded 2-core machine, and nothing this test checks)."""
    import specdec
    import specdec.targets.hf as hf_target
    from specdec.drafts.hf import HFDraft
    from specdec.kernels.linear import accelerate_linears
    from specdec.targets.hf import HFTarget

    monkeypatch.setattr("specdec.kernels.linear.LARGE_ROWS", ())
    monkeypatch.setattr(hf_target, "accelerate_linears", lambda model, rows=None: accelerate_linears(model, max_rows=4, repeats=1))
    model = _tiny_target_model()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        target = HFTarget(model)
        draft = HFDraft(_tiny_target_model(), cpu_linear=False)
        gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="specinfer")
        out = gen.generate([5, 6, 7], 8, specdec.SamplingConfig(temperature=0.0), seed=0)
    assert len(out.tokens) == 8
    return target, [w for w in caught if "fewrow" in str(w.message) or "few-row" in str(w.message)]


def test_a_build_killed_mid_compile_does_not_block_the_next_process(fake_build, monkeypatch, capfd):
    """The goal of issue 57 item 3: SIGKILL during the first build, then a new process."""
    folder = fake_build["folder"]
    proc = _start_killed_build(dict(os.environ))
    try:
        lock = folder.parent / f"{folder.name}.lock"
        assert bl.lock_holder(lock)["pid"] == proc.pid
        assert folder.exists() is False  # nothing published mid-build
        assert [p.name for p in folder.parent.glob(f"{folder.name}.build-*")]  # its private folder
    finally:
        proc.kill()
        proc.wait()
    start = time.monotonic()
    target, fewrow_warnings = _first_generation(monkeypatch)
    assert time.monotonic() - start < 60
    assert fewrow_warnings == []
    plan = target.linear_plans[(1024, 64)]
    assert "fewrow" in plan.seconds[0]  # the kernel was a candidate: built, not left out
    err = capfd.readouterr().err
    assert "removed a stale build lock" in err and f"pid {proc.pid}, is gone" in err
    assert fewrow._complete(folder) and not lock.exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]  # the killed build's folder is gone
    assert (folder / f"{folder.name}.so").read_text() == FAKE


def test_a_live_build_past_the_timeout_falls_back_with_one_warning(fake_build, monkeypatch, capfd):
    folder = fake_build["folder"]
    folder.parent.mkdir(parents=True)
    lock = folder.parent / f"{folder.name}.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": bl.socket.gethostname(), "token": "x"}))
    monkeypatch.setenv(fewrow.BUILD_TIMEOUT_ENV, "0.5")
    start = time.monotonic()
    target, fewrow_warnings = _first_generation(monkeypatch)
    assert time.monotonic() - start < 60
    assert len(fewrow_warnings) == 1
    message = str(fewrow_warnings[0].message)
    assert "\n" not in message
    assert "'fewrow' linear method is left out" in message and "torch layouts" in message
    assert f"pid {os.getpid()}" in message and str(lock) in message
    assert all("fewrow" not in s for s in target.linear_plans[(1024, 64)].seconds)
    assert fake_build["dirs"] == []  # nothing built beside the live build
    assert "waiting for pid" in capfd.readouterr().err
    assert not fewrow_available() and "was not built here" in (fewrow_unavailable_reason() or "")


def test_the_first_build_announces_itself_and_keeps_talking(fake_build, monkeypatch, capfd):
    monkeypatch.setattr(bl, "HEARTBEAT_S", 0.05)
    fake_build["sleep"] = 0.3
    assert fewrow_available()
    folder = fake_build["folder"]
    lines = capfd.readouterr().err.splitlines()
    assert lines[0] == (f"specdec: building specdec's few-row CPU linear kernel (C++, -O3 -march=native "
                        f"-ffp-contract=fast; once per machine and Python environment, {fewrow.USUAL_BUILD}) "
                        f"in {folder}")
    assert any(ln.startswith("specdec: still building") and str(folder) in ln for ln in lines[1:-1])
    assert lines[-1].startswith("specdec: built specdec's few-row CPU linear kernel in")
    # built in a private folder beside the final one, which did not exist until the rename
    (build_dir,) = fake_build["dirs"]
    assert build_dir.parent == folder.parent and build_dir.name.startswith(f"{folder.name}.build-")
    assert fake_build["final_seen"] == [False] and not build_dir.exists()
    marker = json.loads((folder / "specdec-build.json").read_text())
    assert marker["python"] == str(Path(sys.executable).resolve())
    assert marker["torch_dir"] == str(Path(torch.__file__).parent.resolve())


def test_a_published_build_loads_without_compiler_or_lock(fake_build, monkeypatch, capfd):
    assert fewrow_available()
    capfd.readouterr()
    monkeypatch.setattr(fewrow, "_module", None)  # a new process

    def no_compiler(name: str, build_dir: Path) -> Any:
        raise AssertionError("a published build is never rebuilt")

    monkeypatch.setattr(fewrow, "_compile", no_compiler)
    folder = fake_build["folder"]
    lock = folder.parent / f"{folder.name}.lock"
    lock.write_text(json.dumps({"pid": os.getpid(), "host": bl.socket.gethostname(), "token": "x"}))
    monkeypatch.setenv(fewrow.BUILD_TIMEOUT_ENV, "30")
    start = time.monotonic()
    assert fewrow.load_fewrow() is FakeKernel
    assert time.monotonic() - start < 1 and capfd.readouterr().err == ""  # no wait, no message


def test_a_broken_published_library_names_the_folder_to_delete(fake_build, monkeypatch):
    assert fewrow_available()
    folder = fake_build["folder"]
    (folder / f"{folder.name}.so").write_text("garbage")
    monkeypatch.setattr(fewrow, "_module", None)
    assert not fewrow_available()
    assert f"in {folder} could not be loaded" in (fewrow_unavailable_reason() or "")
    assert "delete that folder" in (fewrow_unavailable_reason() or "")


def test_a_failed_compile_leaves_no_folder_and_no_lock(fake_build, monkeypatch):
    def broken(name: str, build_dir: Path) -> Any:
        (build_dir / "main.o").write_text("half")
        raise OSError("no compiler here")

    monkeypatch.setattr(fewrow, "_compile", broken)
    assert not fewrow_available()
    assert "OSError: no compiler here" in (fewrow_unavailable_reason() or "")
    assert list(fake_build["folder"].parent.iterdir()) == []


def test_the_cache_key_covers_the_interpreter_and_torchs_location(monkeypatch, tmp_path):
    base = fewrow._extension_name()
    assert base == fewrow._extension_name()
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "other-venv"))
    assert fewrow._extension_name() != base
    monkeypatch.undo()
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python9"))
    assert fewrow._extension_name() != base
    monkeypatch.undo()
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "torch" / "__init__.py"))
    assert fewrow._extension_name() != base
    monkeypatch.undo()
    # the same environment reached through a symlink shares the build (no rebuild)
    link = tmp_path / "venv-link"
    link.symlink_to(Path(sys.prefix).resolve(), target_is_directory=True)
    monkeypatch.setattr(sys, "prefix", str(link))
    assert fewrow._extension_name() == base


def test_a_bad_timeout_is_refused_by_name(fake_build, monkeypatch):
    monkeypatch.setenv(fewrow.BUILD_TIMEOUT_ENV, "soon")
    with pytest.raises(InvalidConfigError, match="SPECDEC_FEWROW_BUILD_TIMEOUT.*'soon'"):
        fewrow.load_fewrow()
