"""min_p (issue 58, deliverable 3): transformers' ``MinPLogitsWarper`` after temperature, top-k and
top-p, bit for bit; per row; through the step path and every registered builder exactly; refused by
the fused kernel's logits mode by name."""

from __future__ import annotations

import math

import pytest
import torch
from transformers.generation.logits_process import (
    LogitsProcessorList,
    MinPLogitsWarper,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import specdec
from specdec import sampling as sampling_module
from specdec.engine import step as step_module
from specdec.errors import InvalidConfigError
from specdec.models.callable import CallableLM
from specdec.rng import CounterRandom, RowStreams, TorchRandom
from specdec.sampling import (
    RowSampling,
    SamplingConfig,
    construction_config,
    process_logits,
    process_logits_rows,
    warped_scores,
)
from specdec.testing import laws as laws_module
from specdec.testing.laws import ExactLaws, sparse_markov_pair
from specdec.tree_batch import TreeBatch
from specdec.trees import ChainTreeBuilder, build_tree
from specdec.verify import fast as fast_module
from tests.engine._per_row import gap, target_law
from tests.engine.test_row_sampling import SMALL, TARGET, V, _step_law

MIN_P = SamplingConfig(temperature=0.9, min_p=0.3)


def _transformers(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """transformers' warpers in ``generate``'s order (temperature, top-k, top-p, min-p)."""
    warpers = LogitsProcessorList()
    if cfg.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(cfg.temperature))
    if cfg.top_k:
        warpers.append(TopKLogitsWarper(cfg.top_k))
    if cfg.top_p < 1.0:
        warpers.append(TopPLogitsWarper(cfg.top_p))
    warpers.append(MinPLogitsWarper(cfg.min_p))
    return warpers(torch.zeros(logits.shape[0], 1, dtype=torch.long), logits)


@pytest.mark.parametrize("bad", [-0.1, 1.5, math.nan, math.inf, "0.1", True, None])
def test_bad_min_p_is_refused_by_name(bad):
    with pytest.raises(InvalidConfigError, match="min_p"):
        SamplingConfig(min_p=bad)


def test_min_p_defaults_off_and_bounds_are_accepted():
    assert SamplingConfig().min_p == 0.0 and not SamplingConfig().reads_mass
    assert SamplingConfig(min_p=1.0).reads_mass and SamplingConfig(min_p=0).min_p == 0


CONFIGS = [
    SamplingConfig(temperature=1.0, min_p=0.05),
    SamplingConfig(temperature=0.7, min_p=0.1),
    SamplingConfig(temperature=1.5, min_p=0.5),
    SamplingConfig(temperature=0.5, min_p=1.0),
    SamplingConfig(temperature=0.8, top_k=40, min_p=0.2),
    SamplingConfig(temperature=1.3, top_k=3000, min_p=0.01),  # the CPU's narrowed top-k path
    SamplingConfig(temperature=0.9, top_p=0.9, min_p=0.1),
    SamplingConfig(temperature=0.6, top_k=50, top_p=0.8, min_p=0.3),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=str)
@pytest.mark.parametrize("V", [257, 5000])
def test_equals_transformers_bit_for_bit(cfg, V):
    g = torch.Generator().manual_seed(V)
    logits = torch.randn(6, V, generator=g) * 3  # float32, as generate's scores
    logits[1] = (logits[1] * 2).round() / 2  # many exact ties
    logits[2, : V // 3] = float("-inf")  # banned tokens
    logits[3] = 0.0  # one flat row: every token tied with the largest
    if cfg.top_p < 1.0:  # ties at the top-p cut are broken by id here (docs): no ties with top-p
        logits[1], logits[3] = torch.randn(2, V, generator=g)
    ours = warped_scores(logits, cfg)
    theirs = _transformers(logits.clone(), cfg)
    assert torch.equal(ours.isinf(), theirs.isinf())
    assert torch.equal(ours[ours.isfinite()], theirs[theirs.isfinite()])
    assert torch.equal(process_logits(logits, cfg), torch.softmax(theirs, dim=-1))
    assert (ours.isinf() & ~logits.isinf()).any(), "min_p removed nothing: the case has no power"


def test_min_p_reads_the_tempered_law():
    """The threshold is on the law after temperature (transformers' order): ``p_i >= min_p * p_max``
    with ``p = softmax(logits / T)``; the same min_p at another temperature keeps another set."""
    logits = torch.tensor([[0.0, -1.0, -2.0, -3.0]])
    hot = process_logits(logits, SamplingConfig(temperature=2.0, min_p=0.3)) > 0
    cold = process_logits(logits, SamplingConfig(temperature=0.5, min_p=0.3)) > 0
    assert hot.tolist() == [[True, True, True, False]]  # exp(-x / 2) >= 0.3: x <= 2.41
    assert cold.tolist() == [[True, False, False, False]]  # exp(-2x) >= 0.3: x <= 0.60


def test_rows_equal_each_row_alone():
    configs = CONFIGS[:5] + [SamplingConfig(temperature=0.0, min_p=0.5), SamplingConfig(temperature=1.0)] + CONFIGS[5:]
    g = torch.Generator().manual_seed(3)
    for dtype in (torch.float32, torch.float64):
        logits = (torch.randn(len(configs), 3, 300, generator=g) * 3).to(dtype)
        rows = RowSampling.of(configs, len(configs))
        p = process_logits_rows(logits, rows)
        for b, cfg in enumerate(configs):
            assert torch.equal(p[b], process_logits(logits[b], cfg)), (b, cfg)
        kept = rows.keep([4, 0], torch.tensor([4, 0]))
        assert torch.equal(kept.min_p, torch.tensor([configs[4].min_p, configs[0].min_p], dtype=torch.float64))
    assert RowSampling.of(configs, len(configs)).fused().tolist() == [c.temperature > 0 and c.top_p == 1
                                                                      and c.min_p == 0 for c in configs]


def test_the_draft_law_goes_through_min_p():
    """``q`` is processed as ``p`` at ``T > 0`` (construction_config is the target's configuration)."""
    assert construction_config(MIN_P) == MIN_P
    assert construction_config(SamplingConfig(temperature=0.0, min_p=0.5)).min_p == 0.0  # T = 0: untempered draft


def test_min_p_bites_on_the_toy_target():
    assert any(bool(((process_logits(TARGET[a], MIN_P) == 0) & TARGET[a].isfinite()).any()) for a in range(V))


STEP = [SamplingConfig(temperature=0.0), MIN_P, SamplingConfig(temperature=0.8, top_k=4, min_p=0.2)]


@pytest.mark.parametrize("method", sorted(SMALL))
def test_one_mixed_step_with_min_p_rows_is_exact(method):
    """The engine's step path (build, target forward, per-row verification), every row's draws
    enumerated: each min_p row's first two tokens have its own target law."""
    for row in (1, 2):
        assert gap(_step_law(method, row, STEP), target_law(TARGET, row % V, STEP[row])) < 1e-9, (method, row)


def _drop_min_p(c: SamplingConfig) -> SamplingConfig:
    return SamplingConfig(temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)


@pytest.mark.parametrize("method", ["specinfer", "rheo"])
def test_verification_that_ignores_min_p_is_caught(monkeypatch, method):
    """Power: a step whose target law ``p`` drops min_p (the draft law still through it) fails the
    check: the per-row walk's ``p`` (``specinfer``), the tensor form's per-row scores (``rheo``)."""
    real_rows, real_one = sampling_module.warped_scores_rows, step_module.process_logits
    monkeypatch.setattr(fast_module, "warped_scores_rows", lambda logits, rows: real_rows(
        logits, RowSampling.of([_drop_min_p(c) for c in rows.configs], rows.rows)))
    monkeypatch.setattr(step_module, "process_logits", lambda logits, c, **kw: real_one(logits, _drop_min_p(c), **kw))
    assert gap(_step_law(method, 1, STEP), target_law(TARGET, 1, STEP[1])) > 0.02


def test_the_one_configuration_step_path_applies_min_p():
    """The verification's scores at one configuration (``step_scores``) are the warped scores."""
    logits = torch.randn(2, 3, 50, generator=torch.Generator().manual_seed(1))
    scores, temperature = fast_module.step_scores(logits, MIN_P)
    assert temperature == 1.0 and torch.equal(scores, warped_scores(logits, MIN_P))


@pytest.mark.parametrize("method", ["sd", "rheo"])
def test_generate_with_min_p_emits_only_kept_tokens(method):
    gen = specdec.SpeculativeGenerator(target=_lm(), draft=_lm(), method=method, **SMALL[method])
    cfg = SamplingConfig(temperature=1.0, min_p=0.5)
    for seed in range(4):
        out = gen.generate([1], 12, sampling=cfg, seed=seed).tokens
        context = [1] + list(out)
        for prev, tok in zip(context[:-1], context[1:]):
            assert process_logits(TARGET[prev], cfg)[tok] > 0, (seed, prev, tok)


def _lm():
    return CallableLM(lambda ps: TARGET[[p[-1] for p in ps]], vocab_size=V)


def _begun(root: int) -> CallableLM:
    lm = _lm()
    lm.begin([root])
    return lm


def test_the_fused_kernels_logits_mode_refuses_min_p_by_name():
    """The Triton kernel fuses temperature and top-k only: a min_p configuration with raw logits is
    refused by name (a RowSampling's min_p rows verify their processed p instead)."""
    kernels = pytest.importorskip("specdec.kernels.verify_fused")
    tree = TreeBatch.from_trees([build_tree(ChainTreeBuilder(depth=1), 1, _begun(1), MIN_P, TorchRandom.seeded(0))])
    logits = TARGET[[1] * tree.tokens.shape[1]].unsqueeze(0)  # [1, n, V]
    rule = specdec.get("verifier", "match")().fused
    with pytest.raises(InvalidConfigError, match="min-p"):
        kernels.fused_verify_batch(rule, tree, logits, RowStreams([CounterRandom(1)]), inputs="logits", sampling=MIN_P)


@pytest.mark.parametrize("method", ["sd", "rheo"])
def test_the_exact_suite_catches_a_target_law_without_min_p(monkeypatch, method):
    """Power of the registered exact suites' check (``ExactLaws``, as tests/trees/test_exact_trees.py
    runs every registered builder under min_p): exact with min_p on both laws; a verification
    whose ``p`` drops min_p (the draft law still through it) is caught."""
    m = specdec.get("method", method)
    tree_cls = specdec.get("tree", m.tree)

    def error() -> float:
        target, draft = sparse_markov_pair(4, 1)
        laws = ExactLaws(tree_cls(**tree_cls.example_options[0]), specdec.get("verifier", m.verifier)(),
                         target, draft, MIN_P)
        return laws.check((0, 1), 2, chained=True).error

    assert error() < 1e-9
    real = laws_module.process_logits
    monkeypatch.setattr(laws_module, "process_logits", lambda logits, c, **kw: real(logits, _drop_min_p(c), **kw))
    assert error() > 0.01


def test_generation_configs_min_p_is_mapped():
    from_generation_config = pytest.importorskip("specdec.hf_generation").from_generation_config
    from transformers import GenerationConfig

    hf = from_generation_config(GenerationConfig(do_sample=True, min_p=0.1, top_k=0, max_new_tokens=3), 2)
    assert hf.sampling == SamplingConfig(temperature=1.0, min_p=0.1)
    greedy = from_generation_config(GenerationConfig(min_p=0.1, max_new_tokens=3), 2)
    assert greedy.sampling.greedy  # warpers only when sampling, as transformers
