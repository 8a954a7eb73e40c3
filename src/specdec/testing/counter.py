"""Counting host syncs and ATen ops of a speculative step, by call site.

On CUDA every host read of a tensor's value (``item``, ``tolist``, ``bool``,
``float``, ``int``, ``index``) waits for the device; a tensor made from Python
data with ``torch.tensor``/``torch.as_tensor`` is a host-to-device copy. These
are counted at the Python level, so the counts are the same on a CPU as on a
GPU, and tests can assert budgets on them. ATen ops are counted with a
``TorchDispatchMode``. Work inside :func:`specdec.regions.model_call` (the
networks' forwards) is counted apart.

Example:
    >>> import torch
    >>> with StepCounter() as c:
    ...     x = torch.ones(3).sum()
    ...     _ = float(x)
    >>> c.syncs, c.ops >= 2
    (1, True)
"""

from __future__ import annotations

import collections
import sys
from types import FrameType
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from specdec.regions import in_model_call

__all__ = ["KernelCounter", "StepCounter"]

_READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__", "numpy")
_HERE = __file__


def _site(depth: int = 2) -> str:
    frame: FrameType | None = sys._getframe(depth)
    while frame is not None and (frame.f_code.co_filename == _HERE or "/torch/" in frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return "?"
    name = frame.f_code.co_filename
    short = name.split("/src/")[-1] if "/src/" in name else name.rsplit("/", 2)[-1]
    return f"{short}:{frame.f_lineno}"


def _op_site() -> str:
    """The innermost specdec frame (outside the counter) that issued an ATen op."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name != _HERE and "/specdec/" in name and "/torch/" not in name:
            return f"{name.split('/specdec/')[-1]}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


class _OpMode(TorchDispatchMode):
    def __init__(self, owner: "StepCounter") -> None:
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        key = "model" if in_model_call() else "step"
        name = str(func.overloadpacket.__name__)
        self.owner.op_names[key][name] += 1
        if func.is_view:  # a new view of the same storage: no kernel runs
            self.owner.view_names[key][name] += 1
        if self.owner.op_sites is not None:
            self.owner.op_sites[key][_op_site()] += 1
        return func(*args, **(kwargs or {}))


class StepCounter:
    """Context manager counting host syncs and ATen ops (see the module docstring).

    Attributes:
        sync_sites: ``{"step"|"model": Counter(("read", site) or ("h2d", site))}``.
        op_names: ``{"step"|"model": Counter(op name)}``.
        view_names: the same for the ops among them that only make a view
            (``OpOverload.is_view``: no kernel runs on a GPU).
        op_sites: with ``op_sites=True``, ``{"step"|"model": Counter(site)}``:
            the innermost specdec line that issued each ATen op (slower;
            for finding where a step's ops come from).
    """

    def __init__(self, ops: bool = True, op_sites: bool = False) -> None:
        self.count_ops = ops
        self.op_sites: dict[str, collections.Counter] | None = (
            {"step": collections.Counter(), "model": collections.Counter()} if op_sites else None
        )
        self.sync_sites: dict[str, collections.Counter] = {"step": collections.Counter(), "model": collections.Counter()}
        self.op_names: dict[str, collections.Counter] = {"step": collections.Counter(), "model": collections.Counter()}
        self.view_names: dict[str, collections.Counter] = {"step": collections.Counter(), "model": collections.Counter()}
        self._saved: list[tuple[Any, str, Any]] = []
        self._mode: _OpMode | None = None
        self._active = False

    # ------------------------------------------------------------- results
    @property
    def syncs(self) -> int:
        """Host syncs outside model forwards."""
        return sum(self.sync_sites["step"].values())

    @property
    def model_syncs(self) -> int:
        return sum(self.sync_sites["model"].values())

    @property
    def ops(self) -> int:
        """ATen ops outside model forwards."""
        return sum(self.op_names["step"].values())

    @property
    def model_ops(self) -> int:
        return sum(self.op_names["model"].values())

    @property
    def compute_ops(self) -> int:
        """ATen ops outside model forwards that are not views (each a kernel launch on a GPU)."""
        return self.ops - sum(self.view_names["step"].values())

    def report(self, top: int = 15) -> str:
        """The busiest sync sites, outside and inside model forwards."""
        lines = [f"syncs outside models: {self.syncs}, inside: {self.model_syncs}; "
                 f"ops outside: {self.ops}, inside: {self.model_ops}"]
        for key in ("step", "model"):
            for (kind, site), k in self.sync_sites[key].most_common(top):
                lines.append(f"  {key:5s} {kind:4s} {k:6d}  {site}")
        return "\n".join(lines)

    # ------------------------------------------------------------- patching
    def _record(self, kind: str) -> None:
        if self._active:
            self._active = False  # a read made while recording (e.g. numpy -> item) counts once
            try:
                self.sync_sites["model" if in_model_call() else "step"][(kind, _site())] += 1
            finally:
                self._active = True

    def _patch(self, owner: Any, name: str, kind: str, counts: Any = None) -> None:
        """Replace ``owner.name`` by a wrapper that records a ``kind`` event
        (when ``counts(first_argument)`` holds, if given) and calls the original."""
        original = getattr(owner, name)
        counter = self

        def wrapper(first: Any, *args: Any, **kwargs: Any) -> Any:
            if counts is None or counts(first):
                counter._record(kind)
            return original(first, *args, **kwargs)

        self._saved.append((owner, name, original))
        setattr(owner, name, wrapper)

    def __enter__(self) -> "StepCounter":
        for name in _READS:
            self._patch(torch.Tensor, name, "read")
        for name in ("tensor", "as_tensor"):  # a tensor made from Python data: a host-to-device copy
            self._patch(torch, name, "h2d", counts=lambda data: not isinstance(data, torch.Tensor))
        if self.count_ops:
            self._mode = _OpMode(self)
            self._mode.__enter__()
        self._active = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._active = False
        if self._mode is not None:
            self._mode.__exit__(*exc)
            self._mode = None
        for owner, name, original in reversed(self._saved):
            setattr(owner, name, original)
        self._saved.clear()


_KERNEL_MARKS = ("cpp_fused", "triton_")
_LAUNCHES = frozenset({"cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx"})


def _inside(event: Any, marks: Any) -> bool:
    """Whether one of ``event``'s enclosing host events has a name for which ``marks`` holds."""
    parent = event.cpu_parent
    while parent is not None:
        if marks(parent.name):
            return True
        parent = parent.cpu_parent
    return False


def _is_view_op(name: str) -> bool:
    """Whether the ATen op ``name`` (``"aten::reshape"``) only makes a view (no kernel runs)."""
    packet = getattr(torch.ops.aten, name.split("::", 1)[-1], None)
    if packet is None:
        return False
    try:
        return bool(packet.default.is_view)
    except AttributeError:  # no default overload
        return any(getattr(packet, o).is_view for o in packet.overloads())


class KernelCounter:
    """Context manager counting what the host *dispatches* outside model forwards:
    top-level ATen ops (an op another op called counts within its caller) and
    kernels that ``torch.compile``'s inductor generated, by name. Unlike
    :class:`StepCounter` (a ``TorchDispatchMode``, which ``torch.compile`` refuses),
    it reads the profiler's events, so it counts a compiled step too: a fused
    kernel counts once, an op the compiled graph calls (``sort``, ``topk``) once.

    Inductor's CPU kernels appear in the profile only when they were compiled
    with ``torch._inductor.config.cpp.enable_kernel_profile = True``
    (:meth:`profile_compiled_kernels`, before the first compiled call). Work inside
    :func:`specdec.regions.model_call` is left out. Host syncs are not counted here
    (:class:`StepCounter` counts them on the eager path).

    With ``cuda=True`` (a CUDA device present) the profiler also records the
    CUDA runtime, and :attr:`launches` counts the kernel launches the host made
    outside model forwards (``cudaLaunchKernel``, ``cuLaunchKernel``: ATen's
    kernels and Triton's alike), the figure a GPU pays for.

    Attributes:
        op_names: ``Counter(name)`` of the dispatched ATen ops and kernels.
        view_names: the ATen ops among them that only make a view.
        launches: CUDA kernel launches outside model forwards (``cuda=True``; else 0).
    """

    def __init__(self, cuda: bool = False) -> None:
        self.op_names: collections.Counter = collections.Counter()
        self.view_names: collections.Counter = collections.Counter()
        self.launches = 0
        self.cuda = cuda
        self._prof: Any = None

    @staticmethod
    def profile_compiled_kernels() -> None:
        """Make inductor's CPU kernels visible to the profiler (set before compiling)."""
        import torch._inductor.config as inductor_config

        inductor_config.cpp.enable_kernel_profile = True

    @property
    def ops(self) -> int:
        """ATen ops and compiled kernels dispatched outside model forwards."""
        return sum(self.op_names.values())

    @property
    def kernels(self) -> int:
        """Compiled kernels among :attr:`ops`."""
        return sum(k for name, k in self.op_names.items() if any(m in name for m in _KERNEL_MARKS))

    @property
    def compute_ops(self) -> int:
        """:attr:`ops` that are not views (each a kernel launch on a GPU)."""
        return self.ops - sum(self.view_names.values())

    def __enter__(self) -> "KernelCounter":
        import specdec.regions as regions

        regions._profiled += 1
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._prof = torch.profiler.profile(activities=activities)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        import specdec.regions as regions

        try:
            self._prof.__exit__(*exc)
        finally:
            regions._profiled -= 1
        if exc[0] is not None:
            return
        for event in self._prof.events():
            name = event.name
            if name in _LAUNCHES:  # the CUDA runtime's launch call, on the host
                self.launches += not _inside(event, lambda n: n == regions.MODEL_CALL_EVENT)
                continue
            is_kernel = any(m in name for m in _KERNEL_MARKS)
            if not (is_kernel or name.startswith("aten::")):
                continue
            # inside a model forward, another op or a kernel: not dispatched by the step
            if _inside(event, lambda n: n == regions.MODEL_CALL_EVENT or n.startswith("aten::")
                       or any(m in n for m in _KERNEL_MARKS)):
                continue
            self.op_names[name] += 1
            if not is_kernel and _is_view_op(name):
                self.view_names[name] += 1
