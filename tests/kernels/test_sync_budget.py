"""The host-sync budget of the one engine loop, on every path a user can take (issue 42).

A tiny random Llama target with a random EAGLE-3 head (float32, V = 61), 60-node depth-6
trees, T = 1, for ``eagle3`` and ``rheo``: at most :data:`BUDGET` sync-type events per step
outside the model forwards (:class:`specdec.testing.counter.StepCounter`: host reads of
tensors and tensors made from Python data on a device), on the CPU default, with
``kernel="torch"``, with ``kernel="triton"`` (the fused kernel on the device tree batch, run
here by Triton's interpreter: what ``kernel="auto"`` runs on CUDA), batched (B = 4), with a
logits processor and with ``return_logprobs=True``. Counts, not times: they do not depend on
the hardware. The SmolLM2 figures are in ``benchmarks/results/sync_paths.md``.
"""

from __future__ import annotations

import pytest
import torch

import specdec
from specdec.testing.counter import StepCounter

BUDGET = 4
PATHS = ("cpu_default", "torch", "triton", "batch4", "logits_processor", "logprobs")
PROMPTS = [[3, 4, 5, 6], [7, 8], [9, 10, 11, 12, 13], [20, 21, 22]]
TREE = {"N": 60, "depth": 6}


@pytest.fixture(scope="module")
def models():
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.drafts.eagle import make_draft
    from specdec.targets.hf import HFTarget
    from specdec.train.models import new_head

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=61, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).eval()
    head = new_head(model, 3, seed=3)
    with torch.no_grad():
        for p in head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    draft = make_draft(head)
    return HFTarget(model, capture_layers=draft.target_layers), draft


def ban_token(token: int):
    index = {}

    def processor(input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if scores.device not in index:  # made once: a processor's own copies would count too
            index[scores.device] = torch.tensor([token], device=scores.device)
        return scores.index_fill(1, index[scores.device], float("-inf"))

    return processor


def syncs_per_step(models, method: str, path: str, tokens: int = 12) -> tuple[float, str, object]:
    target, draft = models
    kernel = {"torch": "torch", "triton": "triton"}.get(path, "auto")
    gen = specdec.SpeculativeGenerator(target=target, draft=draft, method=method, kernel=kernel, **TREE)
    sampling = specdec.SamplingConfig(temperature=1.0)

    def run(n: int) -> tuple[int, str]:
        if path == "batch4":
            out = gen.generate_batch(PROMPTS, n, sampling, seeds=[0, 1, 2, 3])
            return out.steps, "batch"
        extra = {"logits_processor": ban_token(13)} if path == "logits_processor" else {}
        single = gen.generate(PROMPTS[0], n, sampling, seed=0, return_logprobs=path == "logprobs", **extra)
        return single.stats.steps, single.stats.kernel_path

    run(4)  # warm-up: per-shape index tensors are made once per shape and device
    with StepCounter() as counter:
        steps, kernel_path = run(tokens)
    return counter.syncs / steps, kernel_path, counter


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("method", ["eagle3", "rheo"])
def test_host_syncs_per_step_within_the_budget_on_every_path(models, method, path):
    if path == "triton":
        pytest.importorskip("triton", reason="Triton is not installed: pip install 'specdec-trees[kernels]'")
    per_step, kernel_path, counter = syncs_per_step(models, method, path)
    assert per_step <= BUDGET, counter.report()
    if path == "triton":
        assert kernel_path == "triton"  # the fused kernel ran, on the device tree batch


def test_the_counter_sees_a_step_that_copies_the_tree_to_the_host(models, monkeypatch):
    """The power of the budget: a step that reads its tree on the host every step (the old
    ``kernel="triton"`` path did) is over it."""
    import specdec.engine.step as step_module

    real = step_module.read_rows  # the step's one read (read_step's form with the trees' depths)

    def reads_the_tree(decision, tree, rows=None):
        tree.tree(0)  # the host view of the tree: the reads the device-resident step avoids
        return real(decision, tree, rows)

    monkeypatch.setattr(step_module, "read_rows", reads_the_tree)
    per_step, _, counter = syncs_per_step(models, "rheo", "torch")
    assert per_step > BUDGET, counter.report()
