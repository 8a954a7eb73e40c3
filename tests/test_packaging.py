"""specdec as a dependency others can pin (issue 46): the core imports no optional dependency,
a missing extra is one line naming ``pip install 'specdec-trees[EXTRA]'``, the extras match
``pyproject.toml``, one version, the licence, the deprecation policy on a renamed name, the public
API page, and what the wheel and the sdist hold."""

from __future__ import annotations

import importlib
import json
import re
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pytest

import specdec
from specdec import _extras
from specdec._deprecation import Renamed, deprecated_aliases, deprecation_message
from specdec.errors import MissingExtraError, SpecDecError

ROOT = Path(__file__).resolve().parents[1]
OPTIONAL = ("transformers", "safetensors", "gguf", "rich", "matplotlib", "ray", "scipy", "accelerate", "triton")
"""Modules `import specdec` must not load (the first seven are issue 46's list)."""


def _run(code: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


def _pyproject() -> dict:
    tomllib = pytest.importorskip("tomllib")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


# ------------------------------------------------------------------ import hygiene
def test_import_specdec_loads_no_optional_dependency():
    done = _run(f"""
        import json, sys
        import specdec, specdec.cli, specdec.testing
        print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & set({list(OPTIONAL)!r}))))
    """)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


# ------------------------------------------------------------- the core, extras blocked
BLOCKED = f"""
import sys
for name in {list(OPTIONAL) + ["packaging", "tqdm", "specdec_trees_smollm2"]!r}:
    sys.modules[name] = None  # `import name` raises ModuleNotFoundError, as if not installed
"""


@pytest.fixture(scope="module")
def blocked_run():
    """One interpreter with every optional module blocked: the core's work, then each entry point
    of an extra, recorded as ``{case: [exception type, message] or result}``."""
    done = _run(BLOCKED + """
import contextlib, io, json, torch
import specdec
from specdec.cli import main
from specdec.testing import MarkovLM, random_markov_logits

out = {}
g = torch.Generator().manual_seed(0)
table = random_markov_logits(16, order=2, generator=g)
target = MarkovLM(table)
draft = MarkovLM(table + 0.5 * torch.randn(table.shape, generator=g, dtype=table.dtype))
gen = specdec.SpeculativeGenerator(target=target, draft=draft, method="rheo")
res = gen.generate([1, 2], max_new_tokens=12, sampling=specdec.SamplingConfig(temperature=0.8), seed=0)
ref = specdec.autoregressive_generate(target, [1, 2], 12, sampling=specdec.SamplingConfig(temperature=0.8), seed=0)
out["core"] = [len(res.tokens), len(ref.tokens)]

def call(name, fn):
    try:
        fn()
        out[name] = None
    except Exception as exc:
        out[name] = [type(exc).__name__, str(exc), isinstance(exc, ImportError)]

from specdec.targets.hf import HFTarget
from specdec.drafts.hf import HFDraft
from specdec.models.smollm2 import load_smollm2
from specdec.drafts.eagle.checkpoints import read_state_dict
from specdec.train.models import make_draft_lm
call("HFTarget.from_pretrained", lambda: HFTarget.from_pretrained("some/folder"))
call("HFDraft.from_pretrained", lambda: HFDraft.from_pretrained("some/folder"))
call("load_smollm2", load_smollm2)
import pathlib, tempfile
weights = pathlib.Path(tempfile.mkdtemp()) / "model.safetensors"
weights.write_bytes(b"not read: safetensors is missing")
call("read_state_dict", lambda: read_state_dict(weights))

class Cfg:
    model_type = "llama"
class Model:
    config = Cfg()
call("make_draft_lm", lambda: make_draft_lm(Model()))

def cli(name, argv):
    err, stdout = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(stdout):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    out[name] = [code, err.getvalue(), stdout.getvalue()[:4000]]

cli("bench", ["bench", "--preset", "quick"])
cli("bench --help", ["bench", "--help"])
cli("train-eagle", ["train-eagle", "--target", "smollm2", "--out", "unused"])
cli("train-eagle --help", ["train-eagle", "--help"])
cli("list", ["list", "method"])
print(json.dumps(out))
""", timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_core_runs_with_every_extra_blocked(blocked_run):
    assert blocked_run["core"] == [12, 12]
    code, err, listing = blocked_run["list"]
    assert code == 0 and listing.startswith("method (") and "eagle3" in listing and err == ""


@pytest.mark.parametrize("case,feature,extra", [
    ("HFTarget.from_pretrained", "HFTarget.from_pretrained", "hf"),
    ("HFDraft.from_pretrained", "HFDraft.from_pretrained", "hf"),
    ("load_smollm2", "load_smollm2", "gguf"),
    ("read_state_dict", "reading an EAGLE checkpoint", "hf"),
    ("make_draft_lm", "make_draft_lm", "train"),
])
def test_an_entry_point_without_its_extra_raises_one_line_naming_it(blocked_run, case, feature, extra):
    kind, message, is_import_error = blocked_run[case]
    assert kind == "MissingExtraError" and is_import_error
    assert "\n" not in message
    assert message.startswith(f"{feature} needs the [{extra}] extra (")
    assert message.endswith(f"not installed): pip install 'specdec-trees[{extra}]'")


@pytest.mark.parametrize("command,extra", [("bench", "bench"), ("train-eagle", "train")])
def test_a_command_without_its_extra_exits_2_with_one_line(blocked_run, command, extra):
    code, err, _ = blocked_run[command]
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"specdec {command}: error: specdec {command} needs the [{extra}] extra")
    assert err.rstrip().endswith(f"pip install 'specdec-trees[{extra}]'")
    assert "Traceback" not in err


@pytest.mark.parametrize("command", ["bench --help", "train-eagle --help"])
def test_help_needs_no_extra(blocked_run, command):
    code, err, out = blocked_run[command]
    assert code == 0 and err == "" and out.startswith("usage:")


def test_needs_extra_converts_only_the_extras_own_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtraError) as info:
        with _extras.needs_extra("hf", "a feature"):
            import transformers  # noqa: F401
    err = info.value
    assert isinstance(err, ImportError) and isinstance(err, SpecDecError)
    assert err.extra == "hf" and err.missing == ("transformers",)
    assert str(err) == "a feature needs the [hf] extra (transformers not installed): pip install 'specdec-trees[hf]'"
    # a module that is not the extra's is not specdec's to explain
    with pytest.raises(ModuleNotFoundError) as other:
        with _extras.needs_extra("hf", "a feature"):
            import specdec_no_such_module_xyz  # noqa: F401
    assert not isinstance(other.value, MissingExtraError)
    monkeypatch.setitem(sys.modules, "rich", None)
    assert _extras.missing_modules("bench")[-1] == "rich"
    with pytest.raises(MissingExtraError, match=r"specdec bench needs the \[bench\] extra \(.*rich not installed\)"):
        _extras.require_extra("bench", "specdec bench")


def test_the_extras_match_pyproject():
    optional = _pyproject()["project"]["optional-dependencies"]

    def modules(extra: str) -> set[str]:
        out: set[str] = set()
        for req in optional[extra]:
            name = re.match(r"[A-Za-z0-9_.-]+", req).group(0)
            included = re.match(r"specdec-trees\[([a-z,]+)\]", req)
            if included:
                for inner in included.group(1).split(","):
                    out |= modules(inner)
            else:
                out.add(name.lower().replace("-", "_"))
        return out

    for extra, listed in _extras.EXTRAS.items():
        assert set(listed) == modules(extra), extra
    assert set(optional) - set(_extras.EXTRAS) == {"dev", "docs"}


def test_the_core_dependencies_are_torch_numpy_attrs_with_no_torch_cap():
    deps = _pyproject()["project"]["dependencies"]
    names = {re.match(r"[A-Za-z0-9_.-]+", d).group(0) for d in deps}
    assert names == {"torch", "numpy", "attrs"}
    (torch_req,) = [d for d in deps if d.startswith("torch")]
    assert torch_req == "torch>=2.3"


# ------------------------------------------------------------------------ version
def test_the_version_is_written_once():
    from specdec._version import __version__

    project = _pyproject()
    assert "version" not in project["project"] and project["project"]["dynamic"] == ["version"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "specdec._version.__version__"}
    assert specdec.__version__ == __version__ == "0.1.0"
    done = _run("import sys; from specdec.cli import main; sys.argv[1:] = ['--version']; main()")
    assert done.returncode == 0 and done.stdout == f"specdec {__version__}\n"


def test_the_console_script_prints_the_version():
    script = Path(sys.executable).parent / "specdec"
    if not script.exists():
        pytest.skip("specdec console script not installed next to this interpreter")
    done = subprocess.run([str(script), "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout == f"specdec {specdec.__version__}\n"


# ------------------------------------------------------------------------ licence
def test_the_licence_is_apache_2_and_declared_by_spdx():
    text = (ROOT / "LICENSE").read_text()
    assert text.lstrip().startswith("Apache License") and "Version 2.0, January 2004" in text
    assert "END OF TERMS AND CONDITIONS" in text
    project = _pyproject()["project"]
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # PEP 639: the expression only
    assert "Typing :: Typed" in project["classifiers"] and (ROOT / "src" / "specdec" / "py.typed").is_file()
    weights = ROOT / "src" / "specdec" / "assets"
    if (weights / "pyproject.toml").is_file():  # the weights distribution ships the same text
        assert (weights / "LICENSE").read_text() == text


# -------------------------------------------------------------------- deprecation
def test_a_renamed_name_warns_for_one_minor_release():
    import specdec.testing
    import specdec.testing.laws

    with pytest.warns(DeprecationWarning) as caught:
        old = specdec.testing.random_tables
    assert old is specdec.testing.sparse_markov_pair
    (warning,) = caught
    assert str(warning.message) == ("specdec.testing.random_tables is deprecated since 0.1.0 and will be removed in "
                                    "0.2.0: use specdec.testing.sparse_markov_pair")
    assert warning.filename == __file__  # points at the caller's line
    with pytest.warns(DeprecationWarning, match=r"specdec\.testing\.laws\.random_tables is deprecated"):
        from specdec.testing.laws import random_tables
    assert random_tables is specdec.testing.laws.sparse_markov_pair
    assert "random_tables" not in specdec.testing.__all__ and "sparse_markov_pair" in specdec.testing.__all__
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the new name does not warn
        target, draft = specdec.testing.sparse_markov_pair(3, 0)
    with pytest.raises(AttributeError, match="has no attribute 'no_such_name'"):
        specdec.testing.no_such_name  # noqa: B018


def test_deprecated_aliases_helper():
    namespace = {"new_name": object()}
    getattr_ = deprecated_aliases("pkg.mod", namespace, [Renamed("old_name", "new_name", "1.2.0", "1.3.0")])
    with pytest.warns(DeprecationWarning) as caught:
        assert getattr_("old_name") is namespace["new_name"]
    assert str(caught[0].message) == deprecation_message("pkg.mod", Renamed("old_name", "new_name", "1.2.0", "1.3.0"))
    assert "pkg.mod.old_name is deprecated since 1.2.0 and will be removed in 1.3.0: use pkg.mod.new_name" == str(
        caught[0].message)
    with pytest.raises(AttributeError):
        getattr_("other")


# --------------------------------------------------------------------- public API
def _stable_names() -> list[str]:
    page = (ROOT / "docs" / "api" / "public.md").read_text()
    stable = page.split("\n## Internal\n")[0]
    return sorted(set(re.findall(r"`(specdec(?:\.[A-Za-z_][A-Za-z0-9_]*)+)`", stable)))


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:i]))
        except ModuleNotFoundError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(dotted)


def test_the_public_api_page_lists_only_names_that_exist():
    names = _stable_names()
    assert len(names) > 60
    missing = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # the deprecated names are listed as such
        for name in names:
            try:
                _resolve(name)
            except (ImportError, AttributeError):
                missing.append(name)
    assert missing == []


def test_every_top_level_export_is_on_the_public_api_page():
    names = set(_stable_names())
    assert {f"specdec.{n}" for n in specdec.__all__} - names == set()
    assert "specdec.__version__" in names


# -------------------------------------------------------------- wheel and sdist
_NOT_COPIED = {".git", ".venv", "venv", "site", "build", "dist", "results", "__pycache__", ".mypy_cache",
               ".pytest_cache", ".hypothesis", ".benchmarks"}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """``(sdist, wheel)``: the sdist built from a copy of the checkout (the build writes its
    folders there, not here), and the wheel built from the unpacked sdist, as ``python -m build`` does."""
    import shutil
    import tarfile

    setuptools = pytest.importorskip("setuptools")
    if int(setuptools.__version__.split(".")[0]) < 77:
        pytest.skip("building needs setuptools >= 77 (pyproject.toml's build-system)")
    tmp = tmp_path_factory.mktemp("build")
    tree = tmp / "tree"
    shutil.copytree(ROOT, tree, ignore=lambda d, names: [n for n in names if n in _NOT_COPIED
                                                          or n.endswith((".egg-info", ".pyc"))])

    def build(kind: str, source: Path) -> Path:
        done = subprocess.run([sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_{kind}({str(tmp)!r}))"],
                              capture_output=True, text=True, timeout=600, cwd=source)
        assert done.returncode == 0, done.stderr[-3000:]
        return tmp / done.stdout.strip().splitlines()[-1]

    sdist = build("sdist", tree)
    with tarfile.open(sdist) as tar:
        tar.extractall(tmp / "unpacked", **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
    (unpacked,) = (tmp / "unpacked").iterdir()
    return sdist, build("wheel", unpacked)


def test_the_wheel_is_small_and_holds_no_weights(built):
    import zipfile

    _, wheel = built
    assert wheel.stat().st_size < 2**20
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.endswith((".safetensors", ".gguf", ".bin", ".pt"))]
    assert "specdec/py.typed" in names and "specdec/assets/prompts/question.jsonl" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.startswith(("tests/", "benchmarks/", "docs/"))]
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert f"Version: {specdec.__version__}\n" in metadata and "License-Expression: Apache-2.0\n" in metadata


def test_the_sdist_holds_the_whole_test_suite(built):
    import tarfile

    sdist, _ = built
    with tarfile.open(sdist) as tar:
        names = {n.split("/", 1)[1] for n in tar.getnames() if "/" in n}
    tests = {p.relative_to(ROOT).as_posix() for p in (ROOT / "tests").rglob("*")
             if p.is_file() and "__pycache__" not in p.parts and not p.name.endswith(".pyc")}
    assert tests - names == set()
    for needed in ("LICENSE", "README.md", "pyproject.toml", "mkdocs.yml", ".ci/run", "tests/conftest.py",
                   "docs/tutorial.md", "benchmarks/regression_lock.py"):
        assert needed in names, needed
    assert not [n for n in names if n.endswith(".safetensors") and n.startswith("src/")]
    assert not [n for n in names if n.startswith("benchmarks/results/")]


def test_the_weights_distribution_holds_the_heads_and_the_draft_lm(tmp_path):
    """``specdec-trees-smollm2``, built from src/specdec/assets: the three weight folders, the
    held-out ids and the licence, under the package folder that SHIPPED_DIR falls back on."""
    import shutil
    import zipfile

    from specdec.drafts.eagle import shipped

    assets = ROOT / "src" / "specdec" / "assets"
    if not (assets / "pyproject.toml").is_file() or not all((assets / d / "config.json").is_file()
                                                          for d in shipped._WEIGHT_DIRS):
        pytest.skip("the weights and their pyproject.toml are not in this checkout (an sdist)")
    tree = tmp_path / "assets"
    shutil.copytree(assets, tree, ignore=shutil.ignore_patterns("*.egg-info", "build", "dist"))
    done = subprocess.run([sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_wheel({str(tmp_path)!r}))"],
                          capture_output=True, text=True, timeout=600, cwd=tree)
    assert done.returncode == 0, done.stderr[-3000:]
    wheel = tmp_path / done.stdout.strip().splitlines()[-1]
    assert wheel.name.startswith("specdec_trees_smollm2-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for folder in shipped._WEIGHT_DIRS:
        for f in (assets / folder).iterdir():
            assert f"{shipped._WEIGHTS_PACKAGE}/{folder}/{f.name}" in names
    assert f"{shipped._WEIGHTS_PACKAGE}/sharegpt_heldout_ids.txt" in names
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    assert not [n for n in names if n.endswith((".py", ".jsonl"))]  # data only: no code, not the core's prompts


def test_the_weights_are_found_in_the_weights_distribution(tmp_path, monkeypatch):
    """Outside a clone, SHIPPED_DIR is the folder of the installed specdec-trees-smollm2."""
    from specdec.drafts.eagle import shipped

    package = tmp_path / "site" / "specdec_trees_smollm2"
    (package / "eagle3-smollm2-135m-instruct").mkdir(parents=True)
    (package / "eagle3-smollm2-135m-instruct" / "config.json").write_text("{}")
    fake = tmp_path / "wheel" / "specdec" / "drafts" / "eagle" / "shipped.py"  # a wheel: assets hold no weights
    monkeypatch.setattr(shipped, "__file__", str(fake))
    assert shipped._shipped_dir() == fake.parents[2] / "assets"  # not installed: the empty folder, errors say so
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    importlib.invalidate_caches()
    assert shipped._shipped_dir() == package
    assert "specdec_trees_smollm2" not in sys.modules  # located, never imported
    monkeypatch.setattr(shipped, "SHIPPED_DIR", fake.parents[2] / "assets")
    with pytest.raises(shipped.CheckpointError, match=r"pip install 'specdec-trees\[heads\]'"):
        shipped.shipped_head_path(3)
