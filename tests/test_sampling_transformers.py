"""process_logits keeps exactly the set transformers' warpers keep (issue 17).

The reference is transformers itself: ``TemperatureLogitsWarper``, then
``TopKLogitsWarper``, then ``TopPLogitsWarper`` (the order ``generate`` applies
them), on the scores ``generate`` feeds them (float16/bfloat16 logits cast to
float32; float64 kept, docs/generation.md "Sampling conventions").

One documented difference: ``TopPLogitsWarper`` sorts with torch's default
unstable sort, whose order among equal scores torch leaves unspecified (on
CPU, rows of more than 16 entries do not come out in id order). specdec
sorts stably, so among tokens tied at the top-p cut the highest ids are kept.
The tests therefore compare (a) with transformers run with a stable sort:
the same set on every row, and the same probabilities bit for bit; (b) with
transformers as shipped: the same set wherever no group of equal scores
straddles the cut, and always the same number of tokens; on rows of at most 16
entries its sort is stable and the sets agree everywhere.

Also here: the cases of transformers' own warper tests and of vLLM's
top-k/top-p sampler tests, re-expressed; and an exact-law end-to-end check
that speculative steps sample transformers' law with ties at the cut (a
mutant that keeps the lowest ids fails it).
"""

from __future__ import annotations

import contextlib
import itertools
import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from transformers.generation.logits_process import (
    LogitsProcessorList,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

import specdec.sampling as sampling_module
from specdec.sampling import SamplingConfig, process_logits, top_k_logit_threshold, top_p_keep, warped_scores

NEG_INF = float("-inf")
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
seeded = settings(deadline=None, derandomize=True, max_examples=300,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# --------------------------------------------------------------- reference
@contextlib.contextmanager
def _stable_sort():
    """torch.sort forced stable, for transformers' TopPLogitsWarper."""
    original = torch.sort

    def stable(*args, **kwargs):
        kwargs["stable"] = True
        return original(*args, **kwargs)

    torch.sort = stable
    try:
        yield
    finally:
        torch.sort = original


def hf_scores(logits: torch.Tensor, cfg: SamplingConfig, *, stable: bool = False) -> torch.Tensor:
    """transformers' warped scores ``[R, V]`` (-inf where dropped), as ``generate`` builds them."""
    warpers = LogitsProcessorList()
    if cfg.temperature != 1.0:
        warpers.append(TemperatureLogitsWarper(float(cfg.temperature)))
    if cfg.top_k != 0:
        warpers.append(TopKLogitsWarper(top_k=cfg.top_k))
    if cfg.top_p < 1.0:
        warpers.append(TopPLogitsWarper(top_p=cfg.top_p))
    scores = logits.float() if logits.dtype in (torch.float16, torch.bfloat16) else logits
    with _stable_sort() if stable else contextlib.nullcontext():
        return warpers(None, scores.clone())  # type: ignore[arg-type]


def hf_kept(logits: torch.Tensor, cfg: SamplingConfig, *, stable: bool = False) -> torch.Tensor:
    return hf_scores(logits, cfg, stable=stable) > NEG_INF


def ours_kept(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    return warped_scores(logits, cfg) > NEG_INF


def straddling_ties(logits: torch.Tensor, cfg: SamplingConfig) -> torch.Tensor:
    """``[R]`` bool: a group of equal warped scores straddles the top-p cut
    (some kept, some dropped by top-p), where transformers' unstable sort decides."""
    before_top_p = hf_scores(logits, attrs_evolve(cfg, top_p=1.0))
    kept = hf_kept(logits, cfg, stable=True)
    out = []
    for row, keep in zip(before_top_p, kept):
        cut = row[keep].min()
        ties = (row == cut) & (row > NEG_INF)
        out.append(bool((ties & ~keep).any()))
    return torch.tensor(out)


def attrs_evolve(cfg: SamplingConfig, **changes) -> SamplingConfig:
    import attrs

    return attrs.evolve(cfg, **changes)


def assert_matches_transformers(logits: torch.Tensor, cfg: SamplingConfig) -> None:
    """The full comparison (see the module docstring) on ``[R, V]`` logits."""
    ours = warped_scores(logits, cfg)
    kept = ours > NEG_INF
    stable = hf_scores(logits, cfg, stable=True)
    # the warped scores and the probabilities are transformers', bit for bit
    assert torch.equal(ours, stable), (cfg, logits.dtype)
    assert torch.equal(process_logits(logits, cfg), torch.softmax(stable, dim=-1)), (cfg, logits.dtype)
    shipped = hf_kept(logits, cfg)
    assert torch.equal(kept.sum(-1), shipped.sum(-1)), (cfg, logits.dtype)
    free = ~straddling_ties(logits, cfg) if cfg.top_p < 1.0 else torch.ones(len(logits), dtype=torch.bool)
    assert torch.equal(kept[free], shipped[free]), (cfg, logits.dtype)
    if logits.shape[-1] <= 16:  # transformers' CPU sort is stable on such rows: same set on every row
        assert torch.equal(kept, shipped), (cfg, logits.dtype)


CONFIGS = [
    SamplingConfig(temperature=t, top_k=k, top_p=p)
    for t in (0.5, 0.7, 1.0, 1.3)
    for k in (0, 1, 5, 50, 2000)
    for p in (0.3, 0.8, 0.9, 0.95, 0.999, 1.0)
]


# ------------------------------------------------------- the issue's cases
def test_issue_17_example_keeps_two_as_transformers():
    logits = torch.tensor([[0.3, 0.1, 0.1, 0.5]]).log()
    cfg = SamplingConfig(top_p=0.8)
    assert ours_kept(logits, cfg).tolist() == [[True, False, False, True]]
    assert hf_kept(logits, cfg).tolist() == [[True, False, False, True]]
    # the former rule (descending cumulative mass, float32, keep while the mass before < top_p) keeps three:
    # the example tells the two rules apart
    probs = torch.softmax(logits, -1)
    ordered, _ = torch.sort(probs, descending=True, stable=True)
    mass_before = ordered.cumsum(-1) - ordered
    assert int((mass_before < 0.8).sum()) == 3


def test_ties_at_the_cut_keep_the_highest_ids():
    # four equal tokens, top_p = 0.5: two are removed (cumulative 0.25, 0.5 <= 0.5): ids 0 and 1
    logits = torch.zeros(1, 4)
    assert ours_kept(logits, SamplingConfig(top_p=0.5)).tolist() == [[False, False, True, True]]
    assert hf_kept(logits, SamplingConfig(top_p=0.5)).tolist() == [[False, False, True, True]]
    # a tie group straddling the cut in a longer row: the lowest ids of the group go
    logits = torch.tensor([[0.0, 3.0, 0.0, 1.0, 0.0, 3.0] + [-20.0] * 30])
    kept = ours_kept(logits, SamplingConfig(top_p=0.95))
    assert kept[0, :6].tolist() == [False, True, False, True, True, True]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("V", [4, 16, 50, 3000])
def test_random_rows_match_transformers(dtype, V):
    g = torch.Generator().manual_seed(V)
    logits = (torch.randn(6, V, generator=g) * torch.tensor([0.1, 0.5, 1.0, 2.0, 4.0, 9.0])[:, None]).to(dtype)
    logits[0, : V // 4] = NEG_INF  # banned tokens
    for cfg in CONFIGS:
        assert_matches_transformers(logits, cfg)


@pytest.mark.parametrize("dtype", DTYPES)
def test_ties_at_the_kth_value_match_transformers(dtype):
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 300, generator=g).round().to(dtype)  # every value repeated many times
    logits[1] = logits[1].clamp(max=0.0)  # a huge tie group at the top
    for cfg in CONFIGS:
        # top-k alone reads no sort: the same set as transformers as shipped on every row
        k_only = attrs_evolve(cfg, top_p=1.0)
        assert torch.equal(ours_kept(logits, k_only), hf_kept(logits, k_only))
        assert_matches_transformers(logits, cfg)


@pytest.mark.parametrize("V", [4, 8, 16, 17, 100, 5000])
def test_ties_at_the_top_p_cut_match_transformers(V):
    rows = [
        torch.zeros(V),  # flat: every cut splits the one tie group
        torch.arange(V).float().div(3).floor(),  # groups of three equal scores
        torch.arange(V).remainder(3).float(),  # three interleaved groups
    ]
    logits = torch.stack(rows)
    for p in (0.1, 0.25, 0.5, 0.7, 0.8, 0.9, 0.999):
        for t in (1.0, 0.7):
            assert_matches_transformers(logits, SamplingConfig(temperature=t, top_p=p))
    flat = process_logits(torch.zeros(1, V), SamplingConfig(top_p=0.5)) > 0
    n = int(flat.sum())
    assert flat[0, V - n:].all() and not flat[0, : V - n].any()  # the highest ids


@pytest.mark.parametrize("dtype", DTYPES)
def test_flat_peaked_and_extreme_rows_match_transformers(dtype):
    V = 200
    g = torch.Generator().manual_seed(2)
    rows = [
        torch.zeros(V),  # flat
        torch.randn(V, generator=g) * 1e-3,  # nearly flat
        torch.zeros(V).index_fill(0, torch.tensor([17]), 50.0),  # one token takes all the mass
        torch.zeros(V).index_fill(0, torch.tensor([3, 150]), 8.0),  # two equal peaks
        (torch.arange(V).float() - V // 2) * 100.0,  # an extreme ramp
        torch.randn(V, generator=g) * 30.0,  # very peaked
    ]
    logits = torch.stack(rows).to(dtype)
    for cfg in CONFIGS:
        assert_matches_transformers(logits, cfg)


@pytest.mark.parametrize("top_k", [0, 50])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_large_vocab_paths_match_transformers(top_k, dtype):
    """V = 20000: the narrowed path (top-k 50 leaves at most 1024 finite
    scores) and the CPU values-only sort (no top-k) against transformers."""
    g = torch.Generator().manual_seed(3)
    logits = (torch.randn(4, 20000, generator=g) * torch.tensor([0.5, 2.0, 4.0, 8.0])[:, None]).to(dtype)
    for t, p in ((0.8, 0.9), (1.0, 0.95), (1.3, 0.5)):
        assert_matches_transformers(logits, SamplingConfig(temperature=t, top_k=top_k, top_p=p))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_generate_warps_exactly_like_warped_scores(dtype):
    """transformers' own ``generate`` (do_sample, a tiny random Llama in ``dtype``,
    16 tokens so that its sort is stable): the scores it samples from are
    ``warped_scores`` of the model's logits in their own dtype (generate casts
    them to float32 first, as process_logits does)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaked rows: top-p cuts inside the top-k set
    model = model.to(dtype)
    prompt = torch.tensor([[1, 2, 3]])
    for cfg in (SamplingConfig(temperature=0.7, top_k=8, top_p=0.8), SamplingConfig(temperature=1.0, top_p=0.5),
                SamplingConfig(temperature=1.3, top_k=3)):
        out = model.generate(prompt, do_sample=True, temperature=cfg.temperature, top_k=cfg.top_k, top_p=cfg.top_p,
                             max_new_tokens=5, output_scores=True, output_logits=True, return_dict_in_generate=True,
                             pad_token_id=0, eos_token_id=None)
        for raw, warped in zip(out.logits, out.scores):
            logits = raw.to(dtype)  # generate hands back the float32 copy of the model's logits
            assert torch.equal(logits.float(), raw)
            assert torch.equal(warped_scores(logits, cfg), warped), cfg
            assert torch.equal(process_logits(logits, cfg), torch.softmax(warped, dim=-1)), cfg
        if cfg.top_p < 1.0:  # top-p did cut
            assert any(int((w > NEG_INF).sum()) < (cfg.top_k or 16) for w in out.scores)


# ------------------------------------------------------------ property test
values = st.sampled_from([-3.0, -1.0, -0.5, 0.0, 0.25, 0.5, 1.0, 2.0, NEG_INF])  # few values: many ties


@seeded
@given(st.lists(st.one_of(values, st.floats(-8, 8, width=32)), min_size=1, max_size=40),
       st.sampled_from([0.3, 0.5, 0.7, 1.0, 1.5, 2.0]), st.integers(0, 12),
       st.one_of(st.just(1.0), st.floats(0.01, 0.999), st.sampled_from([0.25, 0.5, 0.75, 0.8, 0.9])),
       st.sampled_from(DTYPES))
def test_property_matches_transformers(row, temperature, top_k, top_p, dtype):
    if all(v == NEG_INF for v in row):
        row = row + [0.0]
    logits = torch.tensor([row]).to(dtype)
    assert_matches_transformers(logits, SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p))


# -------------------------------------- temperature before top-k (rounding)
def _pair_that_rounds_together(temperature: float) -> tuple[float, float]:
    """Two distinct float32 logits whose float32 ``x / T`` are equal."""
    x = torch.tensor(1.5)
    for _ in range(10_000):
        y = torch.nextafter(x, torch.tensor(2.0))
        if (x / temperature) == (y / temperature):
            return float(x), float(y)
        x = y
    raise AssertionError("no pair found")


def test_top_k_is_taken_on_the_scaled_scores():
    a, b = _pair_that_rounds_together(0.7)  # 1.5 / 0.7 > 2: the scores are coarser than the logits
    assert a != b
    logits = torch.tensor([[a, b, 0.0, -1.0]])
    cfg = SamplingConfig(temperature=0.7, top_k=1)
    # transformers keeps both (equal scores tie at the k-th); the raw logits would keep one
    assert hf_kept(logits, cfg).tolist() == [[True, True, False, False]]
    assert ours_kept(logits, cfg).tolist() == [[True, True, False, False]]
    # and the fused kernel's raw-logit threshold selects the same set
    threshold = top_k_logit_threshold(logits, cfg)
    assert ((logits >= threshold[:, None]) == ours_kept(logits, cfg)).all()


@pytest.mark.parametrize("dtype", DTYPES)
def test_kernel_top_k_threshold_selects_the_process_logits_set(dtype):
    g = torch.Generator().manual_seed(4)
    logits = (torch.randn(6, 500, generator=g) * 3).to(dtype)
    logits[2] = logits[2].round()
    for t, k in itertools.product((0.3, 0.7, 1.0, 3.0), (1, 7, 40, 499, 500, 0)):
        cfg = SamplingConfig(temperature=t, top_k=k)
        threshold = top_k_logit_threshold(logits, cfg)
        raw = logits.float() if dtype in (torch.float16, torch.bfloat16) else logits
        assert torch.equal(raw >= threshold[:, None].to(raw.dtype), ours_kept(logits, cfg)), (t, k)


# ------------------------------- transformers' own warper tests, re-expressed
def test_hf_temperature_cases():
    # a uniform row stays uniform; a row with a peak and a valley sharpens at T < 1 and smooths at T > 1
    V = 20
    logits = torch.full((2, V), 1 / V)
    logits[1, 5] += 0.1
    logits[1, 10] -= 0.4
    base = process_logits(logits, SamplingConfig(temperature=1.0))
    sharp = process_logits(logits, SamplingConfig(temperature=0.5))
    smooth = process_logits(logits, SamplingConfig(temperature=1.3))
    torch.testing.assert_close(sharp[0], base[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(smooth[0], base[0], rtol=1e-6, atol=1e-7)
    assert sharp[1].max() > base[1].max() and sharp[1].min() < base[1].min()
    assert smooth[1].max() < base[1].max() and smooth[1].min() > base[1].min()
    assert torch.equal(logits[1, 5], torch.tensor(1 / V + 0.1))  # the input is left alone


def test_hf_top_k_cases():
    V = 10
    ramp = torch.arange(V).float().repeat(2, 1)
    ramp[1, : V // 2] += V
    kept = ours_kept(ramp, SamplingConfig(top_k=3))
    assert kept[0].tolist() == [False] * 7 + [True] * 3
    assert kept[1].tolist() == [False] * 2 + [True] * 3 + [False] * 5
    assert ours_kept(torch.full((2, 5), 0.2), SamplingConfig(top_k=1)).all()  # a uniform row keeps every tie


def test_hf_top_p_cases():
    dist = torch.tensor([[0.3, 0.1, 0.1, 0.5], [0.15, 0.3, 0.3, 0.25]]).log()
    probs = process_logits(dist, SamplingConfig(top_p=0.8))
    assert (probs > 0).tolist() == [[True, False, False, True], [False, True, True, True]]
    torch.testing.assert_close(probs[0], torch.tensor([0.375, 0.0, 0.0, 0.625]))
    # ramps: the first keeps three tokens, the extreme (x100) one only its top token
    ramp = torch.arange(10).float().repeat(2, 1) - 5
    ramp[1] *= 100.0
    assert ours_kept(ramp, SamplingConfig(top_p=0.9)).sum(-1).tolist() == [3, 1]


# ------------------------------------- vLLM's top-k/top-p tests, re-expressed
def test_vllm_top_k_alone_equals_top_k_with_no_op_top_p():
    g = torch.Generator().manual_seed(33)
    logits = torch.rand(16, 4096, generator=g)
    for k in (1, 5, 9, 4096):
        a = process_logits(logits, SamplingConfig(top_k=k))
        b = process_logits(logits, SamplingConfig(top_k=k, top_p=1.0))
        assert torch.equal(a, b)
        assert (a > 0).sum(-1).tolist() == [min(k, 4096)] * 16


def test_vllm_extreme_k_and_p():
    g = torch.Generator().manual_seed(42)
    V = 1024
    logits = torch.randn(16, V, generator=g)
    assert (ours_kept(logits, SamplingConfig(top_k=1)).sum(-1) == 1).all()
    assert ours_kept(logits, SamplingConfig(top_k=V)).all()
    assert (ours_kept(logits, SamplingConfig(top_k=V - 1)).sum(-1) == V - 1).all()
    tight = ours_kept(logits * 10, SamplingConfig(top_p=0.01))  # peaked rows: the top token alone
    assert torch.equal(tight, torch.nn.functional.one_hot(logits.argmax(-1), V).bool())
    assert ours_kept(logits, SamplingConfig(top_p=1.0)).all()
    for p in (0.01, 0.1, 0.5, 0.9):
        assert_matches_transformers(logits, SamplingConfig(top_p=p))


def test_vllm_top_k_and_top_p_large_batch():
    g = torch.Generator().manual_seed(42)
    logits = torch.randn(32, 32000, generator=g)
    for k, p in ((1, 0.6), (10, 0.9), (49, 0.5), (0, 0.75)):
        assert_matches_transformers(logits, SamplingConfig(top_k=k, top_p=p))


# ---------------------------------------------------- the paths agree
def test_the_three_top_p_paths_agree_with_transformers_on_scores():
    """top_p_keep on warped scores: narrowed (CPU, top-k), values-only sort
    (CPU, no top-k) and the sync-free full sort (the CUDA form)."""
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, 6000, generator=g) * 2
    logits[::2] = logits[::2].round(decimals=1)  # ties
    for k, p in ((0, 0.9), (40, 0.9), (1000, 0.95), (1025, 0.5)):
        cfg = SamplingConfig(top_k=k, top_p=p)
        scores = hf_scores(logits, attrs_evolve(cfg, top_p=1.0))
        want = hf_kept(logits, cfg, stable=True)
        assert torch.equal(top_p_keep(scores, p), want)
        assert torch.equal(top_p_keep(scores, p, sync_free=True), want)


# ------------------------------ end to end: speculative steps, exact law
V_E2E = 4
CUT_ROWS = torch.tensor([
    [0.3, 0.1, 0.1, 0.5],  # the issue's row: the two 0.1 leave together
    [0.2, 0.2, 0.2, 0.4],  # top_p 0.7: the cut splits the three 0.2 (ids 0, 1, 2)
    [0.25, 0.25, 0.25, 0.25],
    [0.1, 0.3, 0.3, 0.3],
], dtype=torch.float64).log()


def _tie_table() -> torch.Tensor:
    """An order-2 Markov table whose rows are the rows above, permuted by context."""
    table = torch.empty(V_E2E, V_E2E, V_E2E, dtype=torch.float64)
    for a, b in itertools.product(range(V_E2E), repeat=2):
        row = CUT_ROWS[(a + 2 * b) % len(CUT_ROWS)]
        shift = (a * 3 + b) % V_E2E
        table[a, b] = torch.roll(row, shift)
    return table


def _warped_law(table: torch.Tensor, cfg: SamplingConfig, prompt: tuple[int, ...], n: int) -> dict:
    """The law of ``n`` tokens of plain sampling from transformers' warped scores."""
    law: dict[tuple[int, ...], float] = {}
    for seq in itertools.product(range(V_E2E), repeat=n):
        ctx, prob = list(prompt), 1.0
        for tok in seq:
            probs = torch.softmax(hf_scores(table[tuple(ctx[-2:])][None], cfg), -1)[0]
            prob *= float(probs[tok])
            ctx.append(tok)
        if prob > 0:
            law[seq] = prob
    return law


def _speculative_law(method: str, cfg: SamplingConfig, prompt: tuple[int, ...], n: int) -> dict:
    from specdec.methods import compose, resolve_method
    from specdec.registry import get
    from specdec.engine import run_rows
    from specdec.testing import MarkovLM, exact_law

    table = _tie_table()
    g = torch.Generator().manual_seed(11)
    target, draft = MarkovLM(table), MarkovLM(table + torch.randn(table.shape, generator=g, dtype=torch.float64))
    resolved = resolve_method(method)
    builder, verifier = compose(resolved.tree, resolved.verifier, dict(get("tree", resolved.tree).example_options[0]))

    def program(rng):
        reports = run_rows(target, draft, builder, verifier, [list(prompt)], cfg, [rng], max_new_tokens=n)
        return tuple(t for report in reports for t in report.kept[0])

    return exact_law(program)


def _deviation(a: dict, b: dict) -> float:
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


E2E_CFG = SamplingConfig(temperature=1.0, top_p=0.7)
PROMPT = (0, 1)


@pytest.mark.parametrize("method", ["sd", "rheo"])
def test_speculative_steps_sample_transformers_law_with_ties_at_the_cut(method):
    want = _warped_law(_tie_table(), E2E_CFG, PROMPT, 2)
    got = _speculative_law(method, E2E_CFG, PROMPT, 2)
    assert abs(math.fsum(got.values()) - 1.0) < 1e-9
    assert _deviation(got, want) < 1e-9


def _lowest_ids_top_p_keep(scores: torch.Tensor, top_p: float, *, sync_free: bool | None = None) -> torch.Tensor:
    """Mutant: ties at the cut sorted by descending id (the lowest ids kept, the former rule)."""
    flipped = scores.flip(-1)
    return sampling_module._top_p_keep_full(flipped, top_p).flip(-1)


def test_the_lowest_ids_mutant_is_caught(monkeypatch):
    want = _warped_law(_tie_table(), E2E_CFG, PROMPT, 2)
    monkeypatch.setattr(sampling_module, "top_p_keep", _lowest_ids_top_p_keep)
    got = _speculative_law("sd", E2E_CFG, PROMPT, 2)
    assert _deviation(got, want) > 1e-2
