"""`specdec bench --workers N` over Ray (issue 18): the same records as one process; clear errors."""

from __future__ import annotations

import json
import socket

import pytest

ray = pytest.importorskip("ray", reason="the Ray tests need the ray extra: pip install 'specdec-trees[ray]'")

from specdec import cli  # noqa: E402
from specdec.bench import runner as bench_runner  # noqa: E402
from specdec.bench.runlog import read_runlog  # noqa: E402
from specdec.errors import InvalidConfigError  # noqa: E402

TIMING = {"time_total", "time_prefill", "time_draft", "time_target", "time_verify", "sequence"}
RESULT_TIMING = {"tokens_per_s", "speedup", "time_total", "time_prefill", "time_draft", "time_target", "time_verify"}


@pytest.fixture(scope="module")
def ray_session():
    """One Ray session shared by the tests that use it (starting Ray takes seconds); a WorkerPool uses
    a running session and leaves it running."""
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 1024 ** 2,
             runtime_env={"env_vars": {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}})
    yield
    ray.shutdown()


def _run(capsys, *args):
    code = cli.main(["bench", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _by_key(folder):
    return {(r["row"], r["prompt_index"], r["temperature"], r["seed"]): {k: v for k, v in r.items() if k not in TIMING}
            for r in read_runlog(folder).records}


def test_two_workers_give_the_records_of_one_process(capsys, tiny_dirs, tmp_path):
    args = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "sd,rheo", "--budget", "3", "--depth", "2", "--num-prompts", "3", "--max-new-tokens", "6",
            "--temperatures", "0,1", "--seeds", "0,1", "--threads", "1", "--no-plots"]
    one, two = tmp_path / "one", tmp_path / "two"
    code, _, err = _run(capsys, *args, "--out", one)
    assert code == 0, err
    code, stdout, err = _run(capsys, *args, "--workers", "2", "--out", two)
    assert code == 0, err
    assert "2 worker(s), 1 CPU thread(s) each" in err and "workers: 2" in stdout
    assert read_runlog(two).header == read_runlog(one).header  # the same sweep
    a, b = _by_key(one), _by_key(two)
    assert len(a) == 27 and a == b  # every generation, token for token and step for step
    strip = lambda f: sorted(({k: v for k, v in r.items() if k not in RESULT_TIMING}  # noqa: E731
                              for r in json.loads((f / "results.json").read_text())), key=lambda r: (r["method"], r["temperature"]))
    assert strip(one) == strip(two)
    assert not ray.is_initialized()  # the local cluster the command started is gone with it


def test_with_workers_this_process_loads_no_model(ray_session, capsys, tiny_dirs, tmp_path, monkeypatch):
    """The command's own process loads no model with --workers: worker 0 renders the prompts, checks the rows,
    profiles (Sequoia) and settles ``--budget auto``; its bad-input errors reach the command as they are."""
    def no_load(*a, **k):
        raise AssertionError("the driver loaded the models")

    monkeypatch.setattr("specdec.bench.models.load_bench_models", no_load)
    args = ["--target", tiny_dirs["target"], "--draft", tiny_dirs["draft"], "--prompts", tiny_dirs["prompts"],
            "--methods", "sd,sequoia,sd@ngram", "--budget", "auto", "--num-prompts", "2", "--max-new-tokens", "4",
            "--temperatures", "0,1", "--threads", "1", "--no-plots", "--workers", "2"]
    code, _, err = _run(capsys, *args, "--out", tmp_path / "o")
    assert code == 0, err
    assert "worker 0: profiling Sequoia acceptance" in err and "(auto)" in err, err
    log = read_runlog(tmp_path / "o")
    assert log.header["resolved"]["budget"]["auto"] and log.header["resolved"]["sequoia_acceptance"]
    assert log.header["resolved"]["models"]["target"] == str(tiny_dirs["target"])
    assert len(log.records) == 4 * 2 * 2  # sd, sequoia, sd@ngram and the baseline on 2 prompts at 2 temperatures
    # worker 0 chose a budget per temperature and draft kind; every worker ran each unit with its row's kind's
    chosen = {(e["temperature"], kind): (b["nodes"], b["depth"])
              for e in log.header["resolved"]["budget"]["by_temperature"] for kind, b in e["by_kind"].items()}
    assert set(chosen) == {(0.0, "lm"), (1.0, "lm"), (0.0, "ngram"), (1.0, "ngram")}
    kind = {"sd": "lm", "sequoia": "lm", "sd@ngram": "ngram"}
    assert all((r["budget_nodes"], r["budget_depth"]) == chosen[(r["temperature"], kind[r["row"]])]
               for r in log.records if r["row"] != "autoregressive")
    code, _, err = _run(capsys, *args, "--max-prompt-tokens", "1", "--out", tmp_path / "p")
    assert code == 2 and "every prompt is longer than --max-prompt-tokens 1" in err, err


def test_a_worker_that_cannot_load_the_models(ray_session, tiny_dirs, tmp_path):
    from specdec.bench.workers import WorkerPool

    pool = WorkerPool.connect(1, threads=1)
    try:
        pool.start(dict(target=str(tmp_path / "no-model"), draft="auto", eagle_heads={2: "none", 3: "none"},
                        need_kinds=frozenset({"lm"})))
        with pytest.raises(InvalidConfigError, match="Ray worker 0 .* cannot load the models: .*cannot load the target"):
            pool.wait_ready()
    finally:
        pool.shutdown()


def test_unreachable_ray_address_fails_before_any_work(capsys, tiny_dirs, tmp_path, monkeypatch):
    def boom(*a, **k):
        raise AssertionError("long work started before the input was validated")

    monkeypatch.setattr("specdec.bench.models.load_bench_models", boom)
    monkeypatch.setattr(bench_runner, "run_bench", boom)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for address, message in ((f"127.0.0.1:{port}", "cannot reach a Ray cluster there"),
                             ("no-port", "expected host:port")):
        code, _, err = _run(capsys, "--target", tiny_dirs["target"], "--prompts", tiny_dirs["prompts"], "--methods",
                            "sd", "--budget", "2", "--workers", "2", "--ray-address", address, "--out", tmp_path / "o")
        assert code == 2 and message in err, err


def test_a_failed_unit_is_retried_once_and_a_second_failure_stops_the_sweep(ray_session, tiny_dirs, tmp_path):
    """A worker that dies on a unit: the unit reruns on a fresh worker and the records are complete; a unit
    that kills every worker stops the sweep after one retry, with the units finished before it delivered."""
    import os

    from specdec.bench.budget import Budget
    from specdec.bench.models import load_bench_models
    from specdec.bench.rows import parse_rows
    from specdec.bench.runner import run_bench
    from specdec.bench.sweep import BenchConfig, row_options
    from specdec.bench.workers import WorkerPool, _Worker
    from specdec.errors import SpecDecError

    marker = str(tmp_path / "died-once")

    class DiesOnce(_Worker):  # defined here: Ray ships it to the workers by value
        def run_unit(self, unit, skip):
            if unit == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # the worker process dies mid-unit
            return super().run_unit(unit, skip)

    class AlwaysDies(_Worker):
        def run_unit(self, unit, skip):
            if unit == 2:
                os._exit(1)
            return super().run_unit(unit, skip)

    load_spec = dict(target=str(tiny_dirs["target"]), draft=str(tiny_dirs["draft"]), eagle_heads={2: "none", 3: "none"},
                     need_kinds=frozenset({"lm"}))
    config = BenchConfig(parse_rows("sd", ["lm"]), (0.0, 1.0), (0,), 5, Budget(3, 2), ignore_eos=True)
    prompts = [[2, 10, 11, 3], [2, 12, 3], [2, 13, 14, 15, 3]]
    options = row_options(config)
    reference = run_bench(load_bench_models(**load_spec), config, prompts, options=options)
    logs: list[str] = []
    pool = WorkerPool.connect(1, threads=1, log=logs.append)
    try:
        pool.worker_cls = DiesOnce
        pool.start(load_spec)
        pool.wait_ready()
        got: list = []
        pool.run(config, prompts, options, on_run=got.append)
        assert any("failed on unit 1" in line and "retrying it once" in line for line in logs), logs
        key = lambda r: (r.row, r.prompt_index, r.temperature, r.seed)  # noqa: E731
        assert {key(r): r.tokens for r in got} == {key(r): r.tokens for r in reference} and len(got) == 12

        pool.shutdown_actors()
        pool.worker_cls = AlwaysDies
        pool.start(load_spec)
        pool.wait_ready()
        got = []
        with pytest.raises(SpecDecError, match="unit 2 failed twice"):
            pool.run(config, prompts, options, on_run=got.append)
        assert {(r.prompt_index, r.temperature) for r in got} == {(0, 0.0), (0, 1.0)}  # units 0 and 1, 2 rows each
    finally:
        pool.shutdown()
    assert ray.is_initialized()  # the caller's session is left running


def test_device_cuda_needs_a_gpu_per_worker(ray_session):
    """--device cuda: one GPU per worker; a cluster without enough GPUs is an error, never CPU workers."""
    from specdec.bench.workers import WorkerPool

    gpus = ray.cluster_resources().get("GPU", 0)
    with pytest.raises(InvalidConfigError, match=f"the Ray cluster has {gpus:g} GPU"):
        WorkerPool.connect(int(gpus) + 1, device="cuda")
    cpu_pool = WorkerPool.connect(2, device="cpu", threads=1)
    assert cpu_pool.gpus == 0 and cpu_pool.threads == 1  # GPUs or not, --device cpu gives CPU slices
