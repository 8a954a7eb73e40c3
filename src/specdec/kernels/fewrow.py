"""A few-row linear kernel for the CPU: each weight read once for all rows (issue 48).

Why: a target forward scores the handful of tokens of a draft tree (2-16 on a
CPU). On a memory-bound CPU that forward should cost about what a one-token
forward costs, since the weights are read once either way; but the BLAS paths
behind :func:`torch.nn.functional.linear` (and the other layouts of
:mod:`specdec.kernels.linear`) read or repack the weight per few rows, so on
this project's 2-core AMD EPYC VM SmolLM2-135M's linear layers cost 18.6 ms at
one row and 30.8 ms (1.66x) at five with the best of them
(``benchmarks/results/linear_floor_smollm2.md``).

What: the weight ``[N, K]`` is packed once into column blocks of 16 outputs,
``packed[b, k, j] = weight[16 b + j, k]`` (``[ceil(N / 16), K, 16]``, zero
rows padding ``N`` to a multiple of 16: one extra copy of the weight). The
kernel walks each block's ``K x 16`` slab once, front to back, and for every
``k`` multiplies the slab's 16 values by each input row's ``x[m, k]`` into
``M x 16`` accumulators held in vector registers (four blocks at a time for up
to 6 rows, three for 7-8, two for 9-14; 15-16 rows run as two passes of 8 and
7-8); there are no
horizontal sums. The blocks are shared out among torch's intra-op threads.

Properties, tested (``tests/kernels/test_fewrow.py``):

- the result equals :func:`linear_fewrow_reference` (plain torch, the same
  packed weight) up to float32 summation order;
- **row-count invariance**: every output is the sum over ``k`` in order,
  whatever ``M`` and whatever the other rows hold, so a row's result is the
  same to the bit alone or among 16 rows (``F.linear`` does not promise this).

The C++ source below is compiled on first use with the machine's own vector
instructions (``-march=native``: AVX-512 or AVX2 on x86, NEON on ARM, through
GCC's vector extensions) by :func:`torch.utils.cpp_extension.load_inline`
(30 s of compiler time: about 30 s on this project's idle 2-core VM, 2.5-4.5
minutes when it is busy; once per machine and Python environment). The build (issue 57):

- says so on stderr (what, its usual duration, the folder) and prints a
  progress line every 30 s;
- runs under a lock file ``<specdec cache>/ext/<name>.lock``
  (:mod:`specdec.kernels.build_lock`) recording its pid: a process that finds
  the lock waits with a message, takes over a lock whose holder is dead (or has
  not refreshed it for 2 minutes), and gives up after
  ``SPECDEC_FEWROW_BUILD_TIMEOUT`` seconds (default 900) with the reason below;
- compiles in a temporary folder ``<name>.build-*`` renamed into place as
  ``<specdec cache>/ext/<name>/`` once complete, so a reader never loads a
  half-written library and a published build is never rebuilt in place;
  later processes load its library directly (no compiler, no lock);
- ``<name>`` hashes the source, flags, torch's version and location, the
  resolved interpreter and environment prefix, and the CPU's instruction set
  (:func:`_key_parts`).

Where it cannot be built or loaded (no C++ compiler or ninja, another
process's build that outlasts the timeout), :func:`fewrow_available` is False
with the reason in :func:`fewrow_unavailable_reason`; the linear tuner then
offers the torch layouts only and says so once (a :class:`UserWarning`).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import platform
import secrets
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from specdec._cache import cache_root
from specdec.errors import InvalidConfigError
from specdec.kernels.build_lock import BuildLockTimeout, Heartbeat, build_lock, publish, say

__all__ = [
    "BLOCK",
    "MAX_ROWS",
    "fewrow_available",
    "fewrow_unavailable_reason",
    "linear_fewrow",
    "linear_fewrow_reference",
    "load_fewrow",
    "pack_fewrow",
]

BLOCK = 16
"""Outputs per packed column block (one 512-bit vector of float32)."""

MAX_ROWS = 16
"""The most input rows one call takes (the accumulators live in registers)."""

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>

// 16 float32 lanes; GCC lowers it to one AVX-512 register, two AVX2 ones or four NEON ones.
typedef float v16 __attribute__((vector_size(64), aligned(4)));

// y[m, 16 b + j] = sum_k x[m, k] * p[b, k, j] for the blocks b0 <= b < b1, R blocks at a time.
template <int M, int R>
static void blocks(const float* __restrict x, const float* __restrict p, float* __restrict y,
                   int64_t b0, int64_t b1, int64_t K, int64_t N) {
  int64_t b = b0;
  for (; b + R <= b1; b += R) {
    v16 acc[R][M];
    for (int r = 0; r < R; ++r)
      for (int m = 0; m < M; ++m) acc[r][m] = (v16){};
    const float* slab = p + b * K * 16;
    for (int64_t k = 0; k < K; ++k) {
      v16 w[R];
      for (int r = 0; r < R; ++r) w[r] = *(const v16*)(slab + (r * K + k) * 16);
      for (int m = 0; m < M; ++m) {
        const v16 xv = (v16){} + x[m * K + k];
        for (int r = 0; r < R; ++r) acc[r][m] += w[r] * xv;
      }
    }
    for (int r = 0; r < R; ++r) {
      const int64_t n = (b + r) * 16;
      const int64_t lim = std::min<int64_t>(16, N - n);
      for (int m = 0; m < M; ++m) {
        if (lim == 16) {
          *(v16*)(y + m * N + n) = acc[r][m];
        } else {
          for (int64_t j = 0; j < lim; ++j) y[m * N + n + j] = acc[r][m][j];
        }
      }
    }
  }
  if constexpr (R > 1) {
    if (b < b1) blocks<M, 1>(x, p, y, b, b1, K, N);
  }
}

// blocks per register pass: as many as keep M x R accumulators, R slab vectors and x in 32 registers
template <int M>
static void run(const float* x, const float* p, float* y, int64_t K, int64_t N) {
  constexpr int R = M <= 6 ? 4 : (M <= 8 ? 3 : 2);
  const int64_t nb = (N + 15) / 16;
  at::parallel_for(0, nb, R, [&](int64_t b0, int64_t b1) { blocks<M, R>(x, p, y, b0, b1, K, N); });
}

torch::Tensor fewrow_linear(torch::Tensor x, torch::Tensor packed, int64_t n_out) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous() && x.device().is_cpu(),
              "fewrow_linear: x must be a contiguous float32 CPU [M, K] tensor");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 16 && packed.scalar_type() == at::kFloat &&
              packed.is_contiguous() && packed.device().is_cpu(),
              "fewrow_linear: packed must be a contiguous float32 CPU [ceil(N/16), K, 16] tensor");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(packed.size(1) == K, "fewrow_linear: x has K = ", K, ", the packed weight ", packed.size(1));
  TORCH_CHECK(n_out >= 1 && (n_out + 15) / 16 == packed.size(0), "fewrow_linear: n_out ", n_out,
              " does not match ", packed.size(0), " blocks of 16");
  auto y = torch::empty({M, n_out}, x.options());
  const float* xp = x.data_ptr<float>();
  const float* pp = packed.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  switch (M) {
#define SPECDEC_ROWS(m) case m: run<m>(xp, pp, yp, K, n_out); break;
    SPECDEC_ROWS(1) SPECDEC_ROWS(2) SPECDEC_ROWS(3) SPECDEC_ROWS(4) SPECDEC_ROWS(5) SPECDEC_ROWS(6)
    SPECDEC_ROWS(7) SPECDEC_ROWS(8) SPECDEC_ROWS(9) SPECDEC_ROWS(10) SPECDEC_ROWS(11) SPECDEC_ROWS(12)
    SPECDEC_ROWS(13) SPECDEC_ROWS(14)
#undef SPECDEC_ROWS
    // 15-16 rows: two passes of 8 and 7-8 rows (one pass would keep one block's accumulators only)
    case 15: run<8>(xp, pp, yp, K, n_out); run<7>(xp + 8 * K, pp, yp + 8 * n_out, K, n_out); break;
    case 16: run<8>(xp, pp, yp, K, n_out); run<8>(xp + 8 * K, pp, yp + 8 * n_out, K, n_out); break;
    default: TORCH_CHECK(false, "fewrow_linear takes 1-16 rows, got ", M);
  }
  return y;
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("fewrow_linear", &fewrow_linear); }
"""

_FLAGS = ("-O3", "-march=native", "-ffp-contract=fast")
# -ffp-contract=fast: acc += w * x becomes one fused multiply-add where the CPU has one, the same
# instruction for every accumulator whatever the row count (so the row-count invariance holds);
# measured 1.1-1.3x faster at 5-16 rows than -ffp-contract=off on the 2-core EPYC.

BUILD_TIMEOUT_ENV = "SPECDEC_FEWROW_BUILD_TIMEOUT"
"""Environment variable: the most seconds a process waits for another one's build of the kernel
(default :data:`BUILD_TIMEOUT_S`; then the linear tuner leaves the kernel out with a warning)."""

BUILD_TIMEOUT_S = 900.0
"""The default wait for another process's build: well above a build on a loaded 2-core CPU (2.5-4.5 min)."""

USUAL_BUILD = "about 30 s on an idle 2-core CPU, 3-4 minutes on a busy one"
"""What the first-use announcement says a build takes (this project's 2-core EPYC VM: 30 s of compiler
CPU time, one compiler process; 192 s wall at a load average of 10)."""

_MARKER = "specdec-build.json"
_WHAT = "specdec's few-row CPU linear kernel"

_lock = threading.Lock()
_module: Any = None
_reason: str | None = None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _resolved(path: str) -> str:
    try:
        return str(Path(path).resolve())
    except (OSError, RuntimeError):
        return path


def _key_parts() -> dict[str, str]:
    """What a build depends on: the source and flags, torch (version and location), the interpreter
    (resolved executable, environment prefix, ABI tag) and the CPU's instruction set. Paths are
    resolved, so the same environment reached through another path (a symlink) shares one build; a
    shared home folder on another machine or in another environment gets its own."""
    return {
        "source": hashlib.sha256(_SOURCE.encode()).hexdigest(),
        "flags": " ".join(_FLAGS),
        "torch": torch.__version__,
        "torch_dir": _resolved(str(Path(torch.__file__).parent)),
        "python": _resolved(sys.executable),
        "prefix": _resolved(sys.prefix),
        "abi": sys.implementation.cache_tag or platform.python_version(),
        "machine": platform.machine(),
        "cpu_flags": _cpu_flags(),
    }


def _extension_name() -> str:
    """The build's folder (and module) name: unique per :func:`_key_parts`."""
    key = json.dumps(_key_parts(), sort_keys=True)
    return "specdec_fewrow_" + hashlib.sha256(key.encode()).hexdigest()[:16]


def _library(folder: Path, name: str) -> Path:
    return folder / (name + (".pyd" if sys.platform == "win32" else ".so"))


def _complete(folder: Path) -> bool:
    """A published build: its marker is written before the folder is renamed into place."""
    return (folder / _MARKER).is_file() and _library(folder, folder.name).is_file()


def _compile(name: str, build_dir: Path) -> Any:
    """Compile the extension in ``build_dir`` (private to this build) and return the loaded module."""
    # function-local: torch's extension builder imports setuptools (slow), needed only to build
    from torch.utils.cpp_extension import load_inline

    return load_inline(name, cpp_sources=[_SOURCE], extra_cflags=list(_FLAGS), build_directory=str(build_dir),
                       verbose=False)


def _import_built(name: str, library: Path) -> Any:
    """Load a published build's library as the module ``name`` (no compiler, no lock, no torch baton)."""
    spec = importlib.util.spec_from_file_location(name, library)
    if spec is None or spec.loader is None:
        raise ImportError(f"{library} is not a loadable extension")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _build_timeout() -> float:
    value = os.environ.get(BUILD_TIMEOUT_ENV)
    if value is None or not value.strip():
        return BUILD_TIMEOUT_S
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not seconds >= 0:
        raise InvalidConfigError(f"{BUILD_TIMEOUT_ENV} must be a number of seconds >= 0, got {value!r}")
    return seconds


def _build(name: str, folder: Path) -> Any:
    """Build into a temporary folder beside ``folder`` under the build lock, rename it into place, load it."""
    ext = folder.parent
    ext.mkdir(parents=True, exist_ok=True)
    lock = ext / f"{name}.lock"
    with build_lock(lock, what=_WHAT, timeout=_build_timeout()):
        if _complete(folder):  # another process built it while this one waited
            return _import_built(name, _library(folder, name))
        for leftover in ext.glob(f"{name}.build-*"):  # a killed build's: the lock says none is running
            shutil.rmtree(leftover, ignore_errors=True)
        tmp = ext / f"{name}.build-{os.getpid()}-{secrets.token_hex(4)}"  # not mkdtemp: the umask's modes
        tmp.mkdir()
        try:
            say(f"building {_WHAT} (C++, {' '.join(_FLAGS)}; once per machine and Python environment, "
                f"{USUAL_BUILD}) in {folder}")
            started = time.monotonic()
            with Heartbeat(lambda s: f"still building {_WHAT} ({s:.0f} s so far) in {folder}", touch=lock):
                module = _compile(name, tmp)
            seconds = time.monotonic() - started
            (tmp / _MARKER).write_text(json.dumps({**_key_parts(), "name": name, "seconds": round(seconds, 1)},
                                                  indent=1))
            publish(tmp, folder, _complete)
            say(f"built {_WHAT} in {seconds:.0f} s")
            return module
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)


def load_fewrow() -> Any:
    """The compiled kernel module (built on first use, then loaded from the cache).

    The first use in a new environment builds it (:func:`_build`: announced on stderr with a progress
    line every 30 s; a build killed midway leaves nothing that blocks the next one).

    Raises:
        RuntimeError: it cannot be built or loaded here (the message says why: no compiler, no ninja,
            a failed compile, another process's build that outlasted ``SPECDEC_FEWROW_BUILD_TIMEOUT``).
    """
    global _module, _reason
    if _module is not None:  # every linear call of a forward asks: no lock once built
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _reason is not None:
            raise RuntimeError(_reason)
        name = _extension_name()
        folder = cache_root() / "ext" / name
        if _complete(folder):
            try:
                _module = _import_built(name, _library(folder, name))
            except Exception as exc:  # noqa: BLE001 - reported as the reason, never hidden
                _reason = (f"{_WHAT} in {folder} could not be loaded ({type(exc).__name__}: {exc}); "
                           "delete that folder to build it again")
                raise RuntimeError(_reason) from exc
            return _module
        try:
            _module = _build(name, folder)
        except BuildLockTimeout as exc:
            _reason = f"{_WHAT} was not built here: {exc} ({BUILD_TIMEOUT_ENV} sets the wait)"
            raise RuntimeError(_reason) from exc
        except InvalidConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - any build failure is reported as one reason, never hidden
            text = str(exc).strip()
            detail = text.splitlines()[-1] if text else repr(exc)  # a compiler's last line says what failed
            _reason = (f"{_WHAT} could not be built in {folder} "
                       f"({type(exc).__name__}: {detail}); "
                       "it needs a C++ compiler and ninja (pip install ninja)")
            raise RuntimeError(_reason) from exc
        return _module


def fewrow_available() -> bool:
    """Whether the kernel is built or can be built here (builds it on the first call).

    ``SPECDEC_FEWROW=0`` turns the kernel off (then False, with that as the reason)."""
    global _reason
    if os.environ.get("SPECDEC_FEWROW") == "0":
        return False
    try:
        load_fewrow()
    except RuntimeError:
        return False
    return True


def fewrow_unavailable_reason() -> str | None:
    """Why :func:`fewrow_available` is False (None when it is True or not asked yet)."""
    if os.environ.get("SPECDEC_FEWROW") == "0":
        return "turned off by SPECDEC_FEWROW=0"
    return _reason


def pack_fewrow(weight: torch.Tensor) -> torch.Tensor:
    """``weight`` ``[N, K]`` (float32, CPU) as ``[ceil(N / 16), K, 16]`` column blocks, zero-padded.

    Example:
        >>> import torch
        >>> w = torch.arange(40.0).reshape(20, 2)
        >>> p = pack_fewrow(w)
        >>> p.shape, p[1, 0, 3].item() == w[19, 0].item(), p[1, 0, 4].item()
        (torch.Size([2, 2, 16]), True, 0.0)
    """
    if weight.dim() != 2:
        raise ValueError(f"weight must be [N, K], got shape {tuple(weight.shape)}")
    if weight.device.type != "cpu" or weight.dtype != torch.float32:
        raise ValueError(f"the few-row kernel needs a float32 CPU weight, got {weight.dtype} on {weight.device}")
    n_out, k_in = weight.shape
    blocks = -(-n_out // BLOCK)
    padded = weight.detach().new_zeros(blocks * BLOCK, k_in)
    padded[:n_out] = weight.detach()
    return padded.reshape(blocks, BLOCK, k_in).transpose(1, 2).contiguous()


def _rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1])


def linear_fewrow_reference(x: torch.Tensor, packed: torch.Tensor, n_out: int,
                            bias: torch.Tensor | None = None) -> torch.Tensor:
    """Plain torch: ``x @ weight.T + bias`` with the weight unpacked from ``packed``.

    Args:
        x: ``[..., K]``.
        packed: :func:`pack_fewrow` of a ``[n_out, K]`` weight.
        n_out: ``N``.
        bias: ``[N]`` or None.

    Returns:
        ``[..., N]``.
    """
    weight = packed.transpose(1, 2).reshape(-1, packed.shape[1])[:n_out]
    return F.linear(x, weight, bias)


def linear_fewrow(x: torch.Tensor, packed: torch.Tensor, n_out: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ weight.T + bias`` by the few-row kernel (method ``"fewrow"`` of the linear dispatch).

    Args:
        x: ``[..., K]`` float32 CPU input of 1-16 rows once flattened.
        packed: :func:`pack_fewrow` of the ``[n_out, K]`` weight.
        n_out: ``N``.
        bias: ``[N]`` or None.

    Returns:
        ``[..., N]``, contiguous.

    Raises:
        ValueError: more than :data:`MAX_ROWS` rows, or no row.
        RuntimeError: the kernel cannot be built here (:func:`load_fewrow`).
    """
    lead = x.shape[:-1]
    rows = _rows(x)
    if not 1 <= rows.shape[0] <= MAX_ROWS:
        raise ValueError(f"the few-row kernel takes 1-{MAX_ROWS} rows, got {rows.shape[0]}")
    out = load_fewrow().fewrow_linear(rows.contiguous(), packed, int(n_out))
    if bias is not None:
        out = out + bias
    return out.reshape(*lead, int(n_out))
