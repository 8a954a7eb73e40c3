"""The fixed-shape step (specdec.engine.fixed_step, docs/cuda_graphs.md): each level's work, the
finish and the verification compile with ``torch.compile(fullgraph=True)`` (a graph break
raises) and give, draw for draw, the eager step's trees and decisions (``step_rows`` with
the same sources), for a batch of 2 rows with ragged acceptance over 3 steps. The
``aot_eager`` backend traces the graph a GPU backend compiles (dynamo finds the breaks),
without generating code."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from specdec import registry
from specdec.engine.dispatch import choose_verification
from specdec.engine.fixed_step import FixedStep, fixed_step, run_fixed_step
from specdec.engine.layouts import kv_compaction
from specdec.engine.records import Roles
from specdec.engine.step import commit_step, step_rows
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing import ProposalLM

V = 20
PROMPTS = [[1, 2], [3, 4, 5]]
SEEDS = (11, 12)
STEPS = 3
FIELDS = ("tokens", "parents", "depths", "kinds", "draw_order", "weights", "num_nodes", "law_ids", "law_probs",
          "law_wor", "ancestors", "draft_bad")
DECISION = ("accepted", "num_accepted", "tokens", "bonus", "attempted", "bad_visited", "stop")
KEEP = list(range(1, V, 2))  # eagle3's draft vocabulary: the odd ids


def _tables(proposal: bool) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    target = torch.randn(V, V, generator=g) * 2
    draft = target + 2.5 * torch.randn(V, V, generator=g)  # near the target: ragged acceptance
    if proposal:
        draft[:, [i for i in range(V) if i % 2 == 0]] = float("-inf")
    return target, draft


METHODS = {  # name: (builder, options, verifier, proposal vocabulary)
    "sd": ("chain", {"depth": 3}, "rejection-iid", False),
    "eagle2": ("eagle", {"K": 3, "depth": 3, "N": 7}, "match", False),
    "eagle3": ("eagle", {"K": 3, "depth": 3, "N": 7}, "match", True),
    "rheo": ("rheo", {"K": 3, "depth": 3, "N": 7, "M": 6}, "mixed", False),
}


class _RowsProposalLM(ProposalLM):
    """:class:`~specdec.testing.ProposalLM` whose rows mode answers over its proposal vocabulary too."""

    def root_rows_logits(self, proposal: bool = False) -> torch.Tensor:
        logits = super().root_rows_logits(proposal)
        return logits[..., self.keep] if proposal else logits

    def tree_rows_logits(self, parents: torch.Tensor, tokens: torch.Tensor, proposal: bool = False) -> torch.Tensor:
        logits = super().tree_rows_logits(parents, tokens, proposal)
        return logits[..., self.keep] if proposal else logits


def _roles(method: str):
    tree, options, verifier, proposal = METHODS[method]
    target_table, draft_table = _tables(proposal)
    target = CallableLM(lambda ps: target_table[[p[-1] for p in ps]], vocab_size=V)
    if proposal:
        draft: CallableLM = _RowsProposalLM(lambda ps: draft_table[[p[-1] for p in ps]], vocab_size=V, keep=KEEP)
    else:
        draft = CallableLM(lambda ps: draft_table[[p[-1] for p in ps]], vocab_size=V)
    builder = registry.get("tree", tree)(**options)
    return target, draft, builder, registry.get("verifier", verifier)(), target_table, draft_table, proposal


def _sources() -> RowStreams:
    return RowStreams([TorchRandom.seeded(s) for s in SEEDS])


def _eager_steps(method: str, sampling: SamplingConfig):
    """``STEPS`` steps of the engine's eager step (``step_rows``, then ``commit_step``)."""
    target, draft, builder, verifier, *_ = _roles(method)
    target.prefill_batch(PROMPTS)
    draft.begin_rows(PROMPTS)
    verification = choose_verification(verifier, sampling, "torch", torch.device("cpu"))
    rng, roots, out = _sources(), torch.tensor([p[-1] for p in PROMPTS]), []
    for _ in range(STEPS):
        outcome = step_rows(Roles(target, draft, builder, verifier), verification, sampling, rng, roots)
        commit_step(target, draft, outcome)
        out.append(outcome)
        d = outcome.decision
        roots = d.tokens.gather(1, d.num_accepted.view(-1, 1)).view(-1)
    return out


def _fixed_steps(method: str, sampling: SamplingConfig, fns_of, rows: str = "all"):
    """The same steps through the fixed-shape functions, the engine's forwards as table lookups."""
    _, _, builder, verifier, target_table, draft_table, proposal = _roles(method)
    keep = torch.tensor(KEEP) if proposal else None
    plan = fixed_step(builder, verifier, sampling, batch=2, vocab=V, proposal_ids=keep, rows=rows)
    fns = fns_of(plan)

    def draft_forward(request):
        at = request.tokens if request.tokens is not None else roots
        logits = draft_table[at]  # [B, V] at the root, [B, k, V] after
        return logits[..., keep] if request.proposal else logits

    rng, roots, lens, out = _sources(), torch.tensor([p[-1] for p in PROMPTS]), torch.tensor([2, 3]), []
    for _ in range(STEPS):
        tree, decision = run_fixed_step(plan, fns, draft_forward, lambda tree: target_table[tree.tokens], rng,
                                        roots, lens)
        out.append((tree, decision, lens))
        roots = decision.tokens.gather(1, decision.num_accepted.view(-1, 1)).view(-1)
        lens = decision.kv_lens + 1
    return plan, out


def _compiled(plan: FixedStep):
    torch._dynamo.reset()
    return plan.compiled("aot_eager")


def _same_steps(eager, fixed, plan):
    raggedness = set()
    for outcome, (tree, got, lens) in zip(eager, fixed, strict=True):
        for name in FIELDS:
            assert torch.equal(getattr(tree, name), getattr(outcome.tree, name)), name
        for name in DECISION:
            assert torch.equal(getattr(got, name), getattr(outcome.decision, name)), name
        assert torch.equal(got.packed, outcome.decision.packed())
        kv = kv_compaction(outcome.decision.accepted, outcome.decision.num_accepted, lens)
        assert torch.equal(got.kv_src, kv.src) and torch.equal(got.kv_dst, kv.dst)
        assert torch.equal(got.kv_lens, kv.kv_lens)
        assert tree.node_slots == plan.budget.nodes and tree.law_ids.shape[-1] == plan.budget.law_slots
        raggedness.add(tuple(got.num_accepted.tolist()))
    assert any(a != b for a, b in raggedness), raggedness  # the rows accepted different lengths at some step


@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["T0", "T1"])
@pytest.mark.parametrize("method", list(METHODS))
def test_fixed_step_compiles_fullgraph_and_equals_the_eager_step(method, temperature):
    sampling = SamplingConfig(temperature=temperature)
    eager = _eager_steps(method, sampling)
    plan, plain = _fixed_steps(method, sampling, FixedStep.eager)
    _same_steps(eager, plain, plan)
    plan, compiled = _fixed_steps(method, sampling, _compiled)
    _same_steps(eager, compiled, plan)


def test_the_walk_form_compiles_fullgraph_too():
    """``rows="path"`` (the CPU's verification, one node per depth) compiles and decides as the eager step."""
    sampling = SamplingConfig(temperature=1.0)
    eager = _eager_steps("rheo", sampling)
    plan, compiled = _fixed_steps("rheo", sampling, _compiled, rows="path")
    _same_steps(eager, compiled, plan)


def test_a_graph_break_fails_compilation():
    """Power: a host read inside a level (a tensor's value as a Python bool) breaks the graph,
    and the compiled functions refuse it rather than splitting the graph."""
    sampling = SamplingConfig(temperature=1.0)
    _, _, builder, verifier, *_ = _roles("eagle2")
    plan = fixed_step(builder, verifier, sampling, batch=2, vocab=V)

    class Reads(type(plan)):  # type: ignore[misc]
        def level(self, d, logits, u, root, live, parent_score, constants):
            if bool(logits.sum() > 0):  # a host read
                logits = logits * 1.0
            return super().level(d, logits, u, root, live, parent_score, constants)

    broken = Reads(plan.budget, plan.builder, plan.rule, plan.sampling, plan.rows, None, plan._level, plan._configs)
    with pytest.raises(Exception, match="(?i)graph break|data-dependent|unsupported|Dynamic"):
        _fixed_steps_with(broken, sampling)


def _fixed_steps_with(plan: FixedStep, sampling: SamplingConfig) -> None:
    target_table, draft_table = _tables(False)
    roots = torch.tensor([2, 5])
    fns = _compiled(plan)
    run_fixed_step(plan, fns, lambda r: draft_table[r.tokens if r.tokens is not None else roots],
                   lambda tree: target_table[tree.tokens], _sources(), roots, torch.tensor([2, 3]))


@pytest.mark.parametrize(
    "method, options, match",
    [("chain", {"depth": 3, "confidence": 0.3}, "confidence stop"),
     ("chain", {"depth": 3, "proposal_top_k": 2}, "proposal_top_k"),
     ("static", {}, "no fixed-shape form")],
)
def test_builders_without_a_fixed_shape_are_refused_by_name(method, options, match):
    builder = registry.get("tree", method)(**options)
    with pytest.raises(InvalidConfigError, match=match):
        fixed_step(builder, registry.get("verifier", "rejection-iid")(), SamplingConfig(), batch=2, vocab=V)


def test_bad_arguments_are_refused_by_name():
    builder, verifier = registry.get("tree", "chain")(depth=2), registry.get("verifier", "rejection-iid")()
    with pytest.raises(InvalidConfigError, match="batch"):
        fixed_step(builder, verifier, SamplingConfig(), batch=0, vocab=V)
    with pytest.raises(InvalidConfigError, match="rows"):
        fixed_step(builder, verifier, SamplingConfig(), batch=1, vocab=V, rows="some")
    with pytest.raises(InvalidConfigError, match="tensor rule"):
        fixed_step(builder, registry.get("verifier", "traversal")(), SamplingConfig(), batch=1, vocab=V)


@pytest.mark.slow
def test_inductor_compiles_the_same_graphs():
    """The default backend (inductor: C++ code on a CPU, 30-100 s here) compiles every function with
    fullgraph; the decisions are the eager step's, the laws' float32 bits within rounding (inductor
    sums the softmax in another order)."""
    sampling = SamplingConfig(temperature=1.0)
    eager = _eager_steps("sd", sampling)
    torch._dynamo.reset()
    _, compiled = _fixed_steps("sd", sampling, lambda plan: plan.compiled("inductor"))
    for outcome, (tree, got, _) in zip(eager, compiled, strict=True):
        for name in FIELDS:
            a, b = getattr(tree, name), getattr(outcome.tree, name)
            assert torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b, rtol=0, atol=1e-6), name
        for name in DECISION:
            assert torch.equal(getattr(got, name), getattr(outcome.decision, name)), name


def _gpu_check():
    path = Path(__file__).resolve().parents[2] / "benchmarks" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check_for_test", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_gpu_check_cuda_graph_section_runs_its_cpu_branches(tmp_path):
    """benchmarks/gpu_check.py's CUDA-graph section: without CUDA it records why and does nothing;
    ``--graph-dry-run`` runs its static-buffer replay on the CPU and finds every output equal."""
    gpu_check = _gpu_check()
    skip = ["--skip", "correctness", "timing", "kv", "step", "multi_gpu", "batch", "bench"]
    assert gpu_check.main(["--device", "cpu", *skip, "--out", str(tmp_path / "a")]) == 0
    report = json.loads((tmp_path / "a" / "gpu_check.json").read_text())
    assert "no CUDA device" in report["cuda_graph"]["skipped"] or torch.cuda.is_available()
    assert gpu_check.main(["--device", "cpu", *skip, "--graph-dry-run", "--graph-vocab", "48", "--graph-batch", "2",
                           "--graph-replays", "1", "--reps", "1", "--out", str(tmp_path / "b")]) == 0
    rows = json.loads((tmp_path / "b" / "gpu_check.json").read_text())["cuda_graph"]["rows"]
    assert [r["method"] for r in rows] == ["rheo", "sd"]
    assert all(r["mismatches"] == 0 and r["tensors_compared"] > 0 for r in rows), rows


def test_a_rheo_that_ranks_and_draws_by_two_laws_compiles_and_equals_the_eager_step():
    """``rank_law="untempered"`` at T = 0.7: each level processes the draft's logits twice (the ranking
    and the drawing law), both inside the level's graph."""
    METHODS["rheo-untempered"] = ("rheo", {"K": 3, "depth": 3, "N": 7, "M": 6, "rank_law": "untempered"}, "mixed",
                                  False)
    try:
        sampling = SamplingConfig(temperature=0.7)
        eager = _eager_steps("rheo-untempered", sampling)
        plan, compiled = _fixed_steps("rheo-untempered", sampling, _compiled)
        _same_steps(eager, compiled, plan)
        assert len(plan._configs) == 2
    finally:
        del METHODS["rheo-untempered"]


def test_run_fixed_step_refuses_inputs_off_the_budget_by_name():
    _, _, builder, verifier, target_table, draft_table, _ = _roles("eagle2")
    plan = fixed_step(builder, verifier, SamplingConfig(), batch=2, vocab=V)
    roots, lens = torch.tensor([2, 5]), torch.tensor([2, 3])

    def draft(request):
        return draft_table[request.tokens if request.tokens is not None else roots]

    def run(draft_forward=draft, target_forward=lambda tree: target_table[tree.tokens], roots=roots, lens=lens):
        return run_fixed_step(plan, plan.eager(), draft_forward, target_forward, _sources(), roots, lens)

    run()  # the budget's shapes pass
    with pytest.raises(InvalidConfigError, match="roots must be a \\[2\\] tensor"):
        run(roots=torch.tensor([2, 5, 7]))
    with pytest.raises(InvalidConfigError, match="prefix_lens"):
        run(lens=[2, 3])
    with pytest.raises(InvalidConfigError, match="draft_forward returned logits of shape \\(2, 19\\)"):
        run(draft_forward=lambda request: draft(request)[..., :-1])
    with pytest.raises(InvalidConfigError, match="target_forward"):
        run(target_forward=lambda tree: target_table[tree.tokens][:, :-1])
