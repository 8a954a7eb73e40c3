"""``specdec bench --workers N``: the sweep's units sharded over Ray workers (docs/bench.md).

Ray is an optional extra (``pip install 'specdec-trees[ray]'``), imported only
here. Each worker is a Ray actor that loads the models once (the same flags as
the command; the workers load at the same time, and the command's own process
loads no model: worker 0 renders the prompts, checks the rows and measures the
profiles and ``--budget auto``, :meth:`WorkerPool.prepare`: a budget per
temperature and draft kind, each from that kind's own profile, and rheo's
sampled slots ``m``, which reach every worker in the sweep's
:class:`~specdec.bench.sweep.BenchConfig` and its builder options per
(row, temperature): no worker chooses again) and runs whole units (:func:`~specdec.bench.sweep.bench_units`, or
batches with ``--batch-size``): every row of a unit, the autoregressive
baseline included, runs on that worker in the one-process order (rows rotated
by the unit's index), so speedups stay ratios of rows measured side by side on
the same device. Units are handed out one at a time to whichever worker is
free; each finished unit's records stream back to the driver, which appends
them to ``runs.jsonl`` at once. A generation's tokens depend only on its
prompt, temperature and seed, so the merged records equal a one-process run's
(timings aside).

Placement: with ``--device cpu`` (the default) each worker gets a slice of
``--threads`` CPU threads (default: the cores divided by the workers), GPUs or
not; with ``--device cuda`` each worker reserves one GPU of the cluster (Ray
makes it the worker's ``cuda:0``) and loads its models there; a cluster with
fewer GPUs than workers is an error. ``--ray-address`` joins an existing cluster;
an address that cannot be reached is an error before any model loads. A
program that calls the bench with Ray already initialized keeps its session
(the workers run in it, and it is not shut down afterwards).

Plug-ins: each worker imports the plug-in modules the command loaded
(``--plugin``, and the installed entry-point plug-ins) before its models, from
the folders they were imported from here.

Failures: a worker that cannot load the models (or a plug-in) is an error naming the worker
and the reason, before the first unit runs. A unit whose worker dies or raises
is retried once on a fresh worker (the log says so); a second failure stops
the sweep with the reason. Records already written stay in ``runs.jsonl``, so
rerunning the command resumes.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import attrs

from specdec.bench import models as bench_models
from specdec.bench.prepare import prepare_sweep
from specdec.bench.prompts import BenchPrompt
from specdec.bench.rows import RowSpec
from specdec.bench.runlog import record_from_dict, run_key
from specdec.bench.runner import run_bench
from specdec.bench.settings import BenchSettings
from specdec.bench.sweep import BenchConfig, RunRecord, batch_chunks, bench_units
from specdec.errors import InvalidConfigError, SpecDecError
from specdec.kernels.tuning_scope import DEFAULT_ROWS, tuning_rows
from specdec.plugins import load_plugin

__all__ = ["WorkerPool", "ray_available", "check_ray_address"]


def ray_available() -> bool:
    """Whether Ray can be imported."""
    try:
        import ray  # noqa: F401
    except ImportError:
        return False
    return True


def check_ray_address(address: str, timeout: float = 3.0) -> None:
    """Fail fast when ``address`` (``host:port`` or ``ray://host:port``) does not answer.

    ``auto`` is left to ``ray.init`` (which fails at once without a local cluster).

    Raises:
        InvalidConfigError: malformed address, or no TCP answer within ``timeout`` seconds.
    """
    if address == "auto":
        return
    rest = address[len("ray://"):] if address.startswith("ray://") else address
    host, sep, port = rest.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidConfigError(f"--ray-address {address!r}: expected host:port, ray://host:port or auto")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout):
            pass
    except OSError as exc:
        raise InvalidConfigError(
            f"--ray-address {address}: cannot reach a Ray cluster there ({exc.strerror or exc}); start one with "
            "`ray start --head` or drop --ray-address for a local one"
        ) from None


def _load_plugins(plugins: Sequence[tuple[str, str | None]]) -> None:
    """The plug-ins the command loaded (``specdec bench --plugin``, installed ones), imported in this
    process too, so that their methods resolve here: ``(module, folder)`` pairs, the folder
    (:attr:`specdec.plugins.Plugin.import_root`) added to ``sys.path`` when it is not on it (on a
    cluster, it must exist on the worker's machine too, as the model paths must)."""
    for module, root in plugins:
        if root is not None and root not in sys.path:
            sys.path.append(root)
        load_plugin(module)


class _Worker:
    """One Ray actor: the models, loaded once; runs whole units."""

    def __init__(self, load_spec: Mapping[str, Any], threads: int | None) -> None:
        self.error: str | None = None
        self.warm = False
        if threads:  # before torch is imported here (its thread pools read them), and set again below
            os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(int(threads))
        try:
            import torch

            if threads:
                torch.set_num_threads(int(threads))
            _load_plugins(load_spec.get("plugins", ()))
            with tuning_rows(load_spec.get("linear_rows", DEFAULT_ROWS)):  # the rows this run uses (issue 57)
                self.models = bench_models.load_bench_models(load_spec["target"], load_spec["draft"],
                                                             load_spec["eagle_heads"], need_kinds=load_spec["need_kinds"],
                                                             device=load_spec.get("device", "cpu"))
        except Exception as exc:  # noqa: BLE001 - reported by ready(), never silently
            self.error = f"{type(exc).__name__}: {exc}"

    def ready(self) -> dict[str, Any]:
        import torch

        return {"error": self.error, "pid": os.getpid(), "threads": torch.get_num_threads(),
                "host": socket.gethostname()}

    def prepare(self, args: argparse.Namespace, settings: BenchSettings, rows: Sequence[RowSpec],
                prompts: Sequence[BenchPrompt], prompts_all: Sequence[BenchPrompt], resolved: dict[str, Any] | None,
                resume_path: str = "runs.jsonl") -> dict[str, Any]:
        """:func:`specdec.bench.prepare.prepare_sweep` with this worker's models: its result, its log lines
        (``logs``), or the bad-input error it raised (``error``)."""
        logs: list[str] = []
        try:
            out = prepare_sweep(self.models, args, settings, rows, prompts, prompts_all, resolved, logs.append,
                                resume_path)
        except SpecDecError as exc:
            return {"error": exc, "logs": logs}
        out["logs"] = logs
        return out

    def setup(self, config: BenchConfig, prompts: Sequence[Sequence[int]],
              options: Mapping[tuple[str, float], Mapping[str, Any]]) -> None:
        self.config, self.prompts, self.options = config, prompts, options

    def run_unit(self, unit: int, skip: Collection[tuple[str, int, float, int]]) -> list[dict[str, Any]]:
        config = self.config if not self.warm else attrs.evolve(self.config, warmup=False)
        runs = run_bench(self.models, config, self.prompts, options=self.options, skip=set(skip), units={unit})
        self.warm = True
        return [r.as_dict() for r in runs]


@attrs.define
class WorkerPool:
    """Ray workers of one sweep (:meth:`connect`, :meth:`start`, :meth:`wait_ready`, :meth:`run`, :meth:`shutdown`)."""

    workers: int
    threads: int | None
    gpus: float
    """GPUs each worker reserves: 1 with ``--device cuda``, else 0."""
    log: Callable[[str], None]
    local: bool
    owns: bool = True
    cpus: float = 1.0
    actors: list[Any] = attrs.field(factory=list)
    load_spec: Mapping[str, Any] | None = None
    worker_cls: type = _Worker
    """The actor class (a subclass of ``_Worker``: the tests inject failures with one)."""

    @classmethod
    def connect(cls, workers: int, *, address: str | None = None, threads: int | None = None,
                log: Callable[[str], None] = lambda s: None, device: str = "cpu") -> WorkerPool:
        """Import Ray and start (or join) the cluster.

        Args:
            device: ``"cpu"`` (CPU slices of ``threads`` threads) or ``"cuda"``
                (one GPU per worker).

        Raises:
            InvalidConfigError: Ray is not installed, the address cannot be
                reached, Ray does not start, or ``device="cuda"`` and the
                cluster has fewer GPUs than ``workers``.
        """
        on_gpu = device.startswith("cuda")
        try:
            import ray
        except ImportError:
            raise InvalidConfigError(
                "--workers / --ray-address need Ray: pip install 'specdec-trees[ray]' (or pip install ray)"
            ) from None
        if address:
            check_ray_address(address)
        env = {k: v for k, v in os.environ.items() if k.startswith(("HF_", "TRANSFORMERS_", "SPECDEC_"))}
        owns = not ray.is_initialized()  # a caller's own Ray session is used as it is, and left running
        try:
            if not owns:
                pass
            elif address:
                ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=False,
                         ignore_reinit_error=True)
            else:
                import torch

                gpus = torch.cuda.device_count() if on_gpu and torch.cuda.is_available() else 0
                per = threads or max(1, (os.cpu_count() or 1) // workers)
                if not on_gpu:  # each worker's BLAS/OpenMP pools sized to its slice from the process's start
                    env.update(OMP_NUM_THREADS=str(per), MKL_NUM_THREADS=str(per))
                # minimal overhead: no dashboard, no log forwarding, a small object store (records and prompts)
                # worker_niceness 0: Ray's default runs workers at nice 15, which a one-process run is not (its
                # timings would lose to any other process on the machine)
                ray.init(num_cpus=max(os.cpu_count() or 1, per * workers), num_gpus=gpus, include_dashboard=False,
                         log_to_driver=False, ignore_reinit_error=True, object_store_memory=200 * 1024 ** 2,
                         runtime_env={"env_vars": env}, _system_config={"worker_niceness": 0})
        except Exception as exc:  # noqa: BLE001 - ConnectionError, RuntimeError, ValueError ... from ray.init
            raise InvalidConfigError(f"Ray did not start{f' at {address}' if address else ''}: {exc}") from None
        res = ray.cluster_resources()
        cluster_gpus = float(res.get("GPU", 0))
        if on_gpu and workers > cluster_gpus:
            if owns:
                ray.shutdown()
            raise InvalidConfigError(f"--workers {workers} --device {device}: the Ray cluster has {cluster_gpus:g} "
                                     "GPU(s); one worker per GPU (no worker falls back to the CPU)")
        if not on_gpu:
            threads = threads or max(1, int(res.get("CPU", os.cpu_count() or 1)) // workers)
        where = address or ("local" if owns else "the running session")
        log(f"Ray ({where}): {workers} worker(s), " + ("1 GPU each" if on_gpu else f"{threads} CPU thread(s) each"))
        # CPU slices never ask for more than the cluster has (an actor asking for more would wait forever)
        cpus = min(float(threads or 1), float(res.get("CPU", 1)) / workers) if not on_gpu else 0.0
        return cls(workers=workers, threads=threads, gpus=1.0 if on_gpu else 0.0, log=log, local=not address,
                   owns=owns, cpus=cpus)

    def _new_actor(self) -> Any:
        import ray

        remote = ray.remote(self.worker_cls).options(num_cpus=self.cpus, num_gpus=1 if self.gpus else 0, max_restarts=0)
        return remote.remote(self.load_spec, None if self.gpus else self.threads)

    def start(self, load_spec: Mapping[str, Any]) -> None:
        """Start the workers; each loads the models in the background."""
        self.load_spec = dict(load_spec)
        self.actors = [self._new_actor() for _ in range(self.workers)]

    def wait_ready(self) -> None:
        """Wait for every worker's models.

        Raises:
            InvalidConfigError: a worker could not load the models (or died).
        """
        import ray

        for i, a in enumerate(self.actors):
            try:
                info = ray.get(a.ready.remote())
            except Exception as exc:  # noqa: BLE001
                raise InvalidConfigError(f"Ray worker {i} did not start: {_reason(exc)}") from None
            if info["error"]:
                raise InvalidConfigError(f"Ray worker {i} ({info['host']}) cannot load the models: {info['error']}")
        self.log(f"{len(self.actors)} Ray worker(s) ready")

    def prepare(self, args: argparse.Namespace, settings: BenchSettings, rows: Sequence[RowSpec],
                prompts: Sequence[BenchPrompt], prompts_all: Sequence[BenchPrompt], resolved: dict[str, Any] | None,
                resume_path: str = "runs.jsonl") -> dict[str, Any]:
        """:func:`specdec.bench.prepare.prepare_sweep` on worker 0 (the rendered prompts, the checks, the profiles
        and the budget), so that the command's own process loads no model; the result has the worker's log
        lines under ``logs``.

        Raises:
            SpecDecError: the bad input the worker found (as ``prepare_sweep`` raises it).
            InvalidConfigError: the worker died.
        """
        import ray

        try:
            out = ray.get(self.actors[0].prepare.remote(args, settings, list(rows), list(prompts), list(prompts_all),
                                                        resolved, resume_path=resume_path))
        except Exception as exc:  # noqa: BLE001
            raise InvalidConfigError(f"Ray worker 0 failed while rendering the prompts and profiling: "
                                     f"{_reason(exc)}") from None
        if out.get("error") is not None:
            raise out["error"]
        return out

    def run(self, config: BenchConfig, prompts: Sequence[Sequence[int]],
            options: Mapping[tuple[str, float], Mapping[str, Any]], *,
            skip: Collection[tuple[str, int, float, int]] = frozenset(),
            on_run: Callable[[RunRecord], None] | None = None, on_start: Callable[[str], None] | None = None) -> None:
        """Run every unit with a generation not in ``skip``; ``on_run`` gets each record as its unit returns.

        Raises:
            SpecDecError: a unit failed twice (the records of finished units
                have been passed to ``on_run``).
        """
        import ray

        if config.batch_size > 1:
            units = [(chunk, t, s) for chunk, t, s in
                     batch_chunks(len(prompts), config.temperatures, config.seeds, config.batch_size)]
        else:
            units = [((pi,), t, s) for pi, t, s in bench_units(len(prompts), config.temperatures, config.seeds)]
        todo = []
        for u, (chunk, t, s) in enumerate(units):
            keys = {run_key(r.name, pi, t, s) for r in config.rows for pi in chunk}
            if keys - set(skip):
                todo.append((u, keys & set(skip)))
        todo.reverse()  # pop() hands out the units in order
        payload = (ray.put(config), ray.put(list(prompts)), ray.put(dict(options)))
        for a in self.actors:
            a.setup.remote(*payload)
        inflight: dict[Any, tuple[int, int, Any, int]] = {}  # ref -> (actor index, unit, its skip, attempt)

        def dispatch(i: int, unit: int, sk: Any, attempt: int) -> None:
            inflight[self.actors[i].run_unit.remote(unit, sk)] = (i, unit, sk, attempt)

        for i in range(len(self.actors)):
            if todo:
                u, sk = todo.pop()
                dispatch(i, u, sk, 0)
        done_units = 0
        while inflight:
            ready, _ = ray.wait(list(inflight), num_returns=1)
            ref = ready[0]
            i, unit, sk, attempt = inflight.pop(ref)
            try:
                records = ray.get(ref)
            except Exception as exc:  # noqa: BLE001 - a dead worker or an error inside the unit
                why = _reason(exc)
                if attempt >= 1:
                    self._cancel(inflight)
                    raise SpecDecError(f"unit {unit} failed twice on Ray workers: {why} (finished units are kept in "
                                       "runs.jsonl; rerun the command to resume)") from None
                self.log(f"Ray worker {i} failed on unit {unit} ({why}); retrying it once on a fresh worker")
                try:
                    ray.kill(self.actors[i])
                except Exception:  # noqa: BLE001 - already dead
                    pass
                self.actors[i] = self._new_actor()
                info = ray.get(self.actors[i].ready.remote())
                if info["error"]:
                    self._cancel(inflight)
                    raise InvalidConfigError(f"Ray worker {i} cannot load the models: {info['error']}")
                self.actors[i].setup.remote(*payload)
                dispatch(i, unit, sk, attempt + 1)
                continue
            for r in records:
                if on_run:
                    on_run(record_from_dict(r))
            done_units += 1
            if on_start:
                on_start(f"{done_units}/{done_units + len(todo) + len(inflight)} units ({self.workers} workers)")
            if todo:
                u, nsk = todo.pop()
                dispatch(i, u, nsk, 0)

    def _cancel(self, inflight: Mapping[Any, Any]) -> None:
        import ray

        for ref in inflight:
            try:
                ray.cancel(ref, force=True)
            except Exception:  # noqa: BLE001
                pass

    def shutdown_actors(self) -> None:
        """Stop the workers (the cluster stays up)."""
        import ray

        for a in self.actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001 - already dead
                pass
        self.actors = []

    def shutdown(self) -> None:
        """Stop the workers and disconnect (a local cluster stops; an existing one keeps running; a Ray
        session the caller had started before :meth:`connect` is left as it was)."""
        try:
            import ray
        except ImportError:  # pragma: no cover
            return
        self.shutdown_actors()
        if self.owns:
            ray.shutdown()


def _reason(exc: BaseException) -> str:
    """The last meaningful line of a Ray error (its traceback is long)."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    for ln in reversed(lines):
        if "Error" in ln or "error" in ln:
            return ln[:300]
    return (lines[-1] if lines else type(exc).__name__)[:300]
