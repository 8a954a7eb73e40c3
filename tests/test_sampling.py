"""Property tests for SamplingConfig and process_logits (the one logits -> distribution rule)."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from specdec.errors import InvalidConfigError, InvalidDistributionError
from specdec.sampling import SamplingConfig, check_distribution, process_logits

# no deadline: the machine is shared and timings vary; max_examples comes from the active profile
relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])

NEG_INF = float("-inf")

finite_logit = st.floats(min_value=-30, max_value=30, allow_nan=False, allow_infinity=False)


@st.composite
def logit_rows(draw, min_size=1, max_size=12, allow_neg_inf=True):
    """A list of logits with at least one finite entry (and maybe some -inf)."""
    values = draw(st.lists(finite_logit, min_size=min_size, max_size=max_size))
    if allow_neg_inf:
        banned = draw(st.lists(st.booleans(), min_size=len(values), max_size=len(values)))
        if not all(banned):
            values = [NEG_INF if b else v for v, b in zip(values, banned)]
    return values


@st.composite
def configs(draw, greedy_allowed=True):
    temperature = draw(st.sampled_from([0.0, 1e-3, 0.5, 1.0, 2.0]) if greedy_allowed
                       else st.floats(min_value=0.05, max_value=5))
    top_k = draw(st.integers(min_value=0, max_value=14))
    top_p = draw(st.one_of(st.just(1.0), st.floats(min_value=1e-3, max_value=1.0)))
    return SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)


# ------------------------------------------------------------ validation
@pytest.mark.parametrize("bad", [-1.0, -1e-9, float("nan"), float("inf"), float("-inf"), True, False, "1", None, [1.0]])
def test_bad_temperature(bad):
    with pytest.raises(InvalidConfigError, match="temperature"):
        SamplingConfig(temperature=bad)


@pytest.mark.parametrize("bad", [-1, 1.0, 2.5, float("nan"), True, False, "3", None])
def test_bad_top_k(bad):
    with pytest.raises(InvalidConfigError, match="top_k"):
        SamplingConfig(top_k=bad)


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.0000001, 2, float("nan"), float("inf"), True, False, "0.9", None])
def test_bad_top_p(bad):
    with pytest.raises(InvalidConfigError, match="top_p"):
        SamplingConfig(top_p=bad)


@relaxed
@given(st.floats(min_value=0, max_value=1e6), st.integers(min_value=0, max_value=10**6),
       st.floats(min_value=1e-12, max_value=1.0))
def test_valid_configs_accepted(temperature, top_k, top_p):
    cfg = SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    assert cfg.greedy == (temperature == 0)


def test_config_is_frozen_and_validated_on_evolve():
    import attrs

    cfg = SamplingConfig()
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cfg.temperature = 2.0  # type: ignore[misc]
    with pytest.raises(InvalidConfigError):
        attrs.evolve(cfg, top_p=0.0)
    assert SamplingConfig(temperature=0) .greedy and not SamplingConfig(temperature=1).greedy


@relaxed
@given(st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.integers(), st.booleans(), st.none(), st.text()),
       st.one_of(st.integers(min_value=-5, max_value=5), st.floats(allow_nan=True), st.booleans()),
       st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.booleans()))
def test_config_never_fails_with_another_error(temperature, top_k, top_p):
    try:
        SamplingConfig(temperature=temperature, top_k=top_k, top_p=top_p)
    except InvalidConfigError:
        pass


# ------------------------------------------------------ basic properties
@relaxed
@given(logit_rows(), configs(), st.sampled_from([torch.float32, torch.float64]))
def test_rows_are_distributions(values, cfg, dtype):
    probs = process_logits(torch.tensor(values, dtype=dtype), cfg)
    assert probs.dtype == dtype and probs.shape == (len(values),)
    check_distribution(probs, atol=1e-5 if dtype == torch.float32 else 1e-12)
    # banned tokens are never produced
    for v, prob in zip(values, probs.tolist()):
        if v == NEG_INF:
            assert prob == 0.0


@relaxed
@given(st.lists(logit_rows(min_size=5, max_size=5), min_size=1, max_size=4), configs())
def test_batch_rows_are_processed_independently(rows, cfg):
    batch = torch.tensor(rows, dtype=torch.float64)
    out = process_logits(batch, cfg)
    for i, row in enumerate(rows):
        assert torch.equal(out[i], process_logits(torch.tensor(row, dtype=torch.float64), cfg))
    assert process_logits(batch.reshape(len(rows), 1, 5), cfg).shape == (len(rows), 1, 5)


@relaxed
@given(st.lists(st.integers(-40, 40), min_size=1, max_size=10), st.integers(-400, 400), configs())
def test_invariant_to_adding_a_constant(quarters, shift, cfg):
    # quarter-integers: x + c is exact in float64, so the result must be exactly equal
    x = torch.tensor(quarters, dtype=torch.float64) / 4
    c = shift / 4
    assert torch.allclose(process_logits(x + c, cfg), process_logits(x, cfg), rtol=0, atol=1e-12)


# ------------------------------------------------------------------ top-k
@relaxed
@given(logit_rows(max_size=10), st.integers(min_value=1, max_value=12), st.floats(min_value=0.1, max_value=3))
def test_top_k_keeps_the_k_largest_with_ties(values, k, temperature):
    probs = process_logits(torch.tensor(values, dtype=torch.float64), SamplingConfig(temperature=temperature, top_k=k))
    finite = [v for v in values if v != NEG_INF]
    if k >= len(values):
        expected = {i for i, v in enumerate(values) if v != NEG_INF}
    else:
        kth = sorted(values, reverse=True)[k - 1]
        expected = {i for i, v in enumerate(values) if v >= kth and v != NEG_INF}
    support = {i for i, p in enumerate(probs.tolist()) if p > 0}
    assert support == expected
    assert len(support) >= min(k, len(finite))
    # kept tokens keep their softmax ratios
    kept = sorted(expected)
    ref = torch.softmax(torch.tensor([values[i] for i in kept], dtype=torch.float64) / temperature, 0)
    assert torch.allclose(probs[kept], ref, atol=1e-12)


def test_top_k_ties_with_kth_are_kept():
    probs = process_logits(torch.tensor([1.0, 3.0, 2.0, 2.0, 0.0]), SamplingConfig(top_k=2))
    assert (probs > 0).tolist() == [False, True, True, True, False]


# ------------------------------------------------------------------ top-p
@relaxed
@given(logit_rows(max_size=10), st.floats(min_value=1e-3, max_value=0.999), st.floats(min_value=0.2, max_value=3))
def test_top_p_keeps_smallest_prefix_reaching_mass(values, top_p, temperature):
    x = torch.tensor(values, dtype=torch.float64)
    base = torch.softmax(x / temperature, 0).tolist()
    # by score x / T descending (two scores may round to one probability); among equal scores the
    # highest id first (transformers' rule with a stable ascending sort: the lowest ids are removed
    # first, docs/generation.md "Sampling conventions")
    scores = (x / temperature).tolist()
    order = sorted(range(len(values)), key=lambda i: (-scores[i], -i))
    mass, keep_count = 0.0, 0
    for i in order:
        keep_count += 1
        mass += base[i]
        if mass >= top_p:
            break
    # stay away from rounding at the boundary
    cums = [sum(base[j] for j in order[: m + 1]) for m in range(len(order))]
    assume(all(abs(c - top_p) > 1e-9 for c in cums))
    expected = {i for i in order[:keep_count] if base[i] > 0}
    probs = process_logits(x, SamplingConfig(temperature=temperature, top_p=top_p)).tolist()
    support = {i for i, p in enumerate(probs) if p > 0}
    assert support == expected
    kept_mass = sum(base[i] for i in expected)
    assert kept_mass >= top_p - 1e-12
    # minimal: without its least likely member the kept set falls short of top_p
    assert kept_mass - min(base[i] for i in expected) < top_p
    for i in expected:
        assert math.isclose(probs[i], base[i] / kept_mass, rel_tol=1e-9)


def test_top_p_always_keeps_the_most_likely_token():
    probs = process_logits(torch.tensor([0.0, 5.0, 1.0]), SamplingConfig(top_p=1e-6))
    assert probs.tolist() == [0.0, 1.0, 0.0]


def test_top_k_then_top_p_order():
    # top-k first (keeps 0.5,0.3 of logits' softmax mass renormalised), then top-p on the renormalised law
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64))
    probs = process_logits(logits, SamplingConfig(top_k=2, top_p=0.6))
    assert probs.tolist() == [1.0, 0.0, 0.0]  # 0.5/0.8 = 0.625 >= 0.6
    probs = process_logits(logits, SamplingConfig(top_k=2, top_p=0.7))
    assert torch.allclose(probs, torch.tensor([0.625, 0.375, 0.0], dtype=torch.float64))


# ----------------------------------------------------------------- greedy
@relaxed
@given(logit_rows(min_size=1, max_size=12))
def test_small_temperature_limit_is_greedy(values):
    x = torch.tensor(values, dtype=torch.float64)
    finite = sorted((v for v in values if v != NEG_INF), reverse=True)
    assume(len(finite) == 1 or finite[0] - finite[1] >= 0.01)  # a unique maximum
    greedy = process_logits(x, SamplingConfig(temperature=0))
    near = process_logits(x, SamplingConfig(temperature=1e-4))
    assert greedy.tolist() == torch.nn.functional.one_hot(x.argmax(), len(values)).double().tolist()
    assert torch.allclose(near, greedy, atol=1e-12)


def test_greedy_picks_first_maximum_on_ties():
    assert process_logits(torch.tensor([1.0, 4.0, 4.0, NEG_INF]), SamplingConfig(temperature=0)).tolist() == [
        0.0, 1.0, 0.0, 0.0]


# ------------------------------------------------------------------ dtypes
@relaxed
@given(st.lists(st.floats(min_value=-20, max_value=20, width=16), min_size=1, max_size=12), configs())
def test_float16_input_is_processed_in_float32(values, cfg):
    half = torch.tensor(values, dtype=torch.float16)
    out = process_logits(half, cfg)
    assert out.dtype == torch.float32
    assert torch.equal(out, process_logits(half.float(), cfg))
    check_distribution(out, atol=1e-5)
    assert torch.equal(process_logits(half.bfloat16(), cfg).sum().round(), torch.tensor(1.0))


# --------------------------------------------------------------- -inf rows
@relaxed
@given(logit_rows(min_size=2, max_size=10), configs())
def test_banned_tokens_are_as_if_absent(values, cfg):
    assume(NEG_INF in values)
    full = process_logits(torch.tensor(values, dtype=torch.float64), cfg)
    allowed = [i for i, v in enumerate(values) if v != NEG_INF]
    sub = process_logits(torch.tensor([values[i] for i in allowed], dtype=torch.float64), cfg)
    assert torch.allclose(full[allowed], sub, atol=1e-12)


# ------------------------------------------------------------- bad logits
@pytest.mark.parametrize("bad, message", [
    ([0.0, float("nan"), 1.0], "NaN"),
    ([0.0, float("inf"), 1.0], r"\+inf"),
    ([NEG_INF, NEG_INF], "entirely -inf"),
])
def test_bad_logits_raise(bad, message):
    for cfg in (SamplingConfig(), SamplingConfig(temperature=0)):
        with pytest.raises(InvalidDistributionError, match=message):
            process_logits(torch.tensor(bad), cfg)


@pytest.mark.parametrize("logits, temperature", [([3e35, 0.0], 1e-3), ([10.0, 9.0], 1e-40), ([-3e38, 3e38], 0.5)])
def test_tiny_temperature_or_huge_logits_do_not_overflow(logits, temperature):
    # regression: dividing before shifting overflowed to +inf and softmax returned NaN
    probs = process_logits(torch.tensor(logits), SamplingConfig(temperature=temperature))
    assert sorted(probs.tolist()) == [0.0, 1.0]


def test_one_bad_row_in_a_batch_raises():
    batch = torch.tensor([[0.0, 1.0], [NEG_INF, NEG_INF]])
    with pytest.raises(InvalidDistributionError, match="entirely -inf"):
        process_logits(batch, SamplingConfig())


@pytest.mark.parametrize("bad", [[1, 2, 3], [[]], 3.0, [True, False]])
def test_non_float_or_empty_logits_raise(bad):
    value = torch.tensor(bad) if not isinstance(bad, float) else bad
    with pytest.raises(InvalidDistributionError):
        process_logits(value, SamplingConfig())
    with pytest.raises(InvalidDistributionError):
        process_logits(torch.tensor(3.0), SamplingConfig())


@relaxed
@given(st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), min_size=0, max_size=8), configs())
def test_no_other_exception_on_arbitrary_logits(values, cfg):
    try:
        out = process_logits(torch.tensor(values, dtype=torch.float32), cfg)
    except InvalidDistributionError:
        return
    check_distribution(out, atol=1e-4)


# ------------------------------------------------------ check_distribution
@pytest.mark.parametrize("bad, message", [
    ([0.5, float("nan"), 0.5], "NaN or inf"),
    ([1.5, -0.5], "negative"),
    ([0.5, 0.4], "sum to 1"),
    ([], "shape"),
])
def test_check_distribution_rejects(bad, message):
    with pytest.raises(InvalidDistributionError, match=message):
        check_distribution(torch.tensor(bad, dtype=torch.float64), "p")


def test_check_distribution_names_the_tensor_and_tolerances():
    with pytest.raises(InvalidDistributionError, match="^q "):
        check_distribution(torch.tensor([0.5, 0.4]), "q")
    with pytest.raises(InvalidDistributionError, match="floating-point"):
        check_distribution(torch.tensor([0, 1]), "p")
    check_distribution(torch.tensor([0.5, 0.5 + 5e-5]))  # float32 tolerance 1e-4
    with pytest.raises(InvalidDistributionError):
        check_distribution(torch.tensor([0.5, 0.5 + 5e-5], dtype=torch.float64))  # float64: 1e-9


def test_top_p_fast_path_equals_full_sort() -> None:
    """The narrowed top-p (1024 candidates when top-k left at most that many
    finite scores) and the CPU values-only sort keep exactly the set the full
    stable sort keeps, ties included."""
    from specdec.sampling import _top_p_keep_by_values, _top_p_keep_full, top_p_keep

    g = torch.Generator().manual_seed(0)
    for trial in range(40):
        V = 3000 + 97 * trial
        logits = torch.randn(5, V, generator=g) * (0.5 + trial % 8)
        if trial % 3 == 0:
            logits = logits.round()  # many exact ties
        if trial % 4 == 0:
            logits[:, : V // 2] = logits[:, :1]  # a huge tie group
        if trial % 2:  # top-k first: rows 0-2 narrowed, rows 3-4 (top-k 2000) sorted in full
            k = torch.tensor([5, 50, 1000, 2000, 2000])[:, None]
            kth = torch.sort(logits, dim=-1, descending=True).values.gather(-1, k - 1)
            logits = logits.masked_fill(logits < kth, float("-inf"))
        for dtype in (torch.float32, torch.float64):
            scores = logits.to(dtype)
            for top_p in (0.3, 0.9, 0.999):
                full = _top_p_keep_full(scores, top_p)
                assert torch.equal(top_p_keep(scores, top_p), full)
                assert torch.equal(_top_p_keep_by_values(scores, top_p), full)


def test_tail_softmax_is_the_full_rows_softmax_bit_for_bit() -> None:
    """The short softmax layout (length congruent to V modulo 1024) gives the
    bits of the full ``[R, V]`` row that is -inf but for its tail, on this
    machine's vector width; the plain softmax of the tail alone does not
    (which is why the layout is needed)."""
    from specdec.sampling import _tail_softmax

    g = torch.Generator().manual_seed(3)
    plain_differs = 0
    for dtype in (torch.float32, torch.float64):
        for V in (1000, 4099, 32000, 49152, 128256):
            for c in (1, 7, 50, 64, 65, 114, 1088):
                if c > V:
                    continue
                tail = (4 * torch.randn(6, c, generator=g, dtype=dtype)).sort(dim=-1).values
                tail[0, : c // 3] = float("-inf")  # -inf among the candidates too
                full = torch.full((6, V), float("-inf"), dtype=dtype)
                full[:, V - c:] = tail
                want = torch.softmax(full, dim=-1)[:, V - c:]
                assert torch.equal(_tail_softmax(tail, V), want), (dtype, V, c)
                plain_differs += not torch.equal(torch.softmax(tail, dim=-1), want)
    assert plain_differs > 0


def _warped_by_full_sort(logits: torch.Tensor, cfg) -> torch.Tensor:
    """warped_scores by the long way: every pass over ``[R, V]``, a full stable sort for top-p."""
    from specdec.sampling import _top_p_keep_full, temperature_scores

    scores = temperature_scores(logits, cfg.temperature)
    kth = torch.topk(scores, cfg.top_k, dim=-1).values[..., -1:]
    scores = scores.masked_fill(scores < kth, float("-inf"))
    if cfg.top_p < 1.0:
        scores = scores.masked_fill(~_top_p_keep_full(scores, cfg.top_p), float("-inf"))
    return scores


def test_top_k_candidates_path_equals_the_full_path(monkeypatch) -> None:
    """CPU rows with top-k on are warped from their top_k + 64 largest logits
    (temperature, top-k and top-p on those alone): the same scores, bit for
    bit, as the passes over every entry with a full sort; with top-p on, rows
    whose top-k ties overflow the candidates take the full path."""
    import specdec.sampling as sampling
    from specdec.sampling import SamplingConfig, warped_scores

    calls: list[bool] = []
    narrowed = sampling._top_k_top_p_scores

    def spy(logits, cfg):
        out = narrowed(logits, cfg)
        calls.append(out is not None)
        return out

    monkeypatch.setattr(sampling, "_top_k_top_p_scores", spy)
    g = torch.Generator().manual_seed(4)
    for trial in range(24):
        V = 2000 + 331 * trial
        logits = torch.randn(5, V, generator=g) * (0.5 + trial % 6)
        if trial % 3 == 0:
            logits = (logits * 4).round() / 4  # exact ties at the k-th value and at the cut
        if trial % 4 == 1:
            logits[1, : V - 20] = float("-inf")  # fewer finite logits than top-k
        if trial % 5 == 2:
            logits[2, :] = logits[2, :1]  # a flat row: every token tied (the full path)
        for dtype in (torch.float32, torch.float64):
            for cfg in (SamplingConfig(temperature=0.7, top_k=50, top_p=0.9), SamplingConfig(top_k=5, top_p=0.5),
                        SamplingConfig(temperature=1.3, top_k=300), SamplingConfig(temperature=0.31, top_k=1, top_p=0.8)):
                x = logits.to(dtype)
                assert torch.equal(warped_scores(x, cfg), _warped_by_full_sort(x, cfg)), (trial, dtype, cfg)
    assert any(calls) and not all(calls)  # both paths were taken


def test_sync_free_top_p_reads_nothing_and_keeps_the_same_set() -> None:
    """The CUDA form of top-p (sync_free, the default on CUDA tensors) sorts in
    full with no host read; the narrowed form reads once when a row is unsettled."""
    from specdec.sampling import top_p_keep
    from specdec.testing.counter import StepCounter

    g = torch.Generator().manual_seed(1)
    scores = torch.randn(4, 5000, generator=g) * 0.3
    scores[:2] = scores[:2].masked_fill(scores[:2] < 0.4, float("-inf"))  # rows 0-1 narrowed, rows 2-3 sorted
    with StepCounter() as free:
        fast = top_p_keep(scores, 0.9, sync_free=True)
    with StepCounter() as narrowed:
        slow = top_p_keep(scores, 0.9, sync_free=False)
    assert torch.equal(fast, slow)
    assert free.syncs == 0 and narrowed.syncs >= 1, (free.report(), narrowed.report())


def test_temperature_one_takes_no_extra_pass_and_gives_the_same_bits():
    """At T = 1 process_logits skips the explicit shift and division: softmax
    shifts by the maximum itself, so the result is bit for bit the shifted form."""
    import torch

    from specdec.sampling import SamplingConfig, process_logits

    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(7, 3000, generator=g, dtype=dtype) * 6
        x[0, :50] = float("-inf")
        shifted = torch.softmax((x - x.amax(-1, keepdim=True)) / 1.0, dim=-1)
        assert torch.equal(process_logits(x, SamplingConfig(temperature=1.0)), shifted)


def _assert_same_scores(got: torch.Tensor, want: torch.Tensor, what) -> None:
    """Equal entries, NaN where NaN (bit for bit but for the sign of a zero)."""
    assert got.dtype == want.dtype and got.shape == want.shape, what
    assert torch.equal(torch.isnan(got), torch.isnan(want)), what
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), what


def _hard_top_k_rows(V: int, k: int, temperature: float, g: torch.Generator) -> torch.Tensor:
    """``[9, V]`` float32 logits whose top-k sets outrun ``k + 64`` candidates, or are odd."""
    x = torch.randn(9, V, generator=g) * 3
    kth = torch.topk(x[1], k).values[-1]
    x[1, torch.randperm(V, generator=g)[:300]] = kth  # 300 ties with the k-th: more than the margin
    # row 2: 300 ties with the k-th logit v, and v's float32 predecessor, which the temperature
    # rounds onto the same score: kept, with a logit below every candidate
    grid = 5.0 + torch.arange(4096) * 2 ** -21  # consecutive float32s
    below = torch.nextafter(grid, torch.tensor(float("-inf")))
    merged = torch.nonzero(grid / temperature == below / temperature).flatten()
    v = float(grid[merged[0]]) if len(merged) else 5.0
    x[2] = -20.0
    x[2, : k - 1] = 9.0
    spots = torch.randperm(V - k, generator=g)[:301] + k
    x[2, spots[:300]] = v
    x[2, spots[300]] = torch.nextafter(torch.tensor(v), torch.tensor(float("-inf")))
    x[3, : V - 20] = float("-inf")  # fewer finite logits than top-k
    x[4, 17] = float("nan")
    x[5, :3] = float("inf")  # fewer +inf logits than k (k >= 5 below)
    x[6, : k + 70] = float("inf")  # more +inf logits than the candidates
    x[7] = float("-inf")
    x[8] = 1e30 + (x[8] * 1e23)  # the row's max / T overflows at a tiny T: shifted scores
    x[8, torch.randperm(V, generator=g)[:200]] = torch.topk(x[8], k).values[-1]
    return x


@pytest.mark.parametrize("search_from", [0, None])
def test_top_k_alone_reads_nothing_and_equals_the_full_pass_beyond_the_candidates(search_from, monkeypatch) -> None:
    """Top-k without top-p on the CPU takes the ``top_k`` largest logits and no host read (issue 56):
    tokens tied with the k-th beyond them (300 ties; a distinct logit the temperature rounds onto
    the k-th score; a shifted row at a tiny T) are kept, and NaN / +inf / -inf rows get the full
    pass's scores, for every temperature, float32 and float64; by the search for the smallest
    logit scoring the k-th (``search_from=0``) and, below its size, by the full pass."""
    import specdec.sampling as sampling
    from specdec.sampling import _top_k_top_p_scores, warped_scores
    from specdec.testing.counter import StepCounter

    if search_from is not None:
        monkeypatch.setattr(sampling, "_SEARCH_MIN_ENTRIES", search_from)
    g = torch.Generator().manual_seed(11)
    merged_beyond = 0
    for temperature in (0.7, 1.3, 37.0, 1e-3, 1e-37, 1.0):
        for k in (5, 40):
            cfg = SamplingConfig(temperature=temperature, top_k=k)
            logits = _hard_top_k_rows(3000, k, temperature, g)
            for dtype in (torch.float32, torch.float64):
                x = logits.to(dtype)
                with StepCounter() as counter:
                    got = warped_scores(x, cfg)
                    direct = _top_k_top_p_scores(x, cfg)
                assert counter.syncs == 0, counter.report()
                want = _warped_by_full_sort(x, cfg)
                _assert_same_scores(got, want, (temperature, k, dtype))
                _assert_same_scores(direct, want, (temperature, k, dtype, "candidates"))
                if dtype == torch.float32:
                    kept = want[2] > float("-inf")
            candidates = torch.topk(logits[2], k + 64).indices
            beyond = kept.clone()
            beyond[candidates] = False
            merged_beyond += bool((logits[2][beyond] < logits[2][candidates].min()).any())
    assert merged_beyond > 0  # a logit below every candidate was kept: the search, not a tie of logits


def test_the_smallest_logit_scoring_the_kth_is_the_boundary() -> None:
    """:func:`specdec.sampling._smallest_logit_scoring` gives the float32 logit at which
    ``(l - shift) / T`` reaches the k-th score: it scores at least ``kth``, the float below it less."""
    from specdec.sampling import _smallest_logit_scoring

    g = torch.Generator().manual_seed(5)
    for temperature in (0.31, 1.0, 2.5, 1e3, 1e-30):
        above = torch.randn(64, 1, generator=g) * torch.tensor([1e-3, 1.0, 1e4, 1e30]).repeat(16)[:, None]
        shift = torch.where(torch.arange(64)[:, None] % 3 == 0, above.abs() + 1, torch.zeros_like(above))
        score = (above - shift) / temperature
        ok = torch.isfinite(score)
        above, shift, kth = above[ok][:, None], shift[ok][:, None], score[ok][:, None]
        limit = _smallest_logit_scoring(kth, shift, temperature, above)
        below = torch.nextafter(limit, torch.tensor(float("-inf")))
        assert bool(((limit - shift) / temperature >= kth).all()), temperature
        assert bool(((below - shift) / temperature < kth).all()), temperature


def _top_p_by_full_sort(logits: torch.Tensor, cfg) -> torch.Tensor:
    from specdec.sampling import _top_p_keep_full, temperature_scores

    scores = temperature_scores(logits, cfg.temperature)
    return scores.masked_fill(~_top_p_keep_full(scores, cfg.top_p), float("-inf"))


def test_values_sort_top_p_reads_only_its_view_and_cuts_inside_a_tie_group() -> None:
    """Top-p without top-k on CPU rows wider than 1024 sorts values alone (NumPy): the one host
    event is that ``.numpy()`` view; no read asks whether a row has ties at the cut (issue 56).
    The kept set is the full stable sort's when the cut falls inside a tie group (the lowest ids
    removed), with more ties than any margin, and for NaN / +inf / all -inf rows."""
    from specdec.sampling import _top_p_keep_full, _top_p_remove_by_values, warped_scores
    from specdec.testing.counter import StepCounter

    g = torch.Generator().manual_seed(12)
    V = 3000
    x = torch.randn(7, V, generator=g) * 2
    x[1] = 0.0
    x[1, torch.randperm(V, generator=g)[:10]] = 8.0  # 2990 tokens tied at 0 hold ~6% of the mass
    x[2] = (x[2] * 2).round() / 2  # many tie groups
    x[3, 5] = float("nan")
    x[4, 9] = float("inf")
    x[5] = float("-inf")
    x[6, : V // 2] = x[6, :1]  # a tie group of 1500
    cut_inside = 0
    for temperature in (1.0, 0.8):
        for top_p in (0.3, 0.95, 0.999):
            cfg = SamplingConfig(temperature=temperature, top_p=top_p)
            for dtype in (torch.float32, torch.float64):
                with StepCounter() as counter:
                    got = warped_scores(x.to(dtype), cfg)
                assert counter.syncs == 1, counter.report()
                assert {kind for kind, _ in counter.sync_sites["step"]} == {"read"}
                want = _top_p_by_full_sort(x.to(dtype), cfg)
                _assert_same_scores(got, want, (temperature, top_p, dtype))
                if temperature == 1.0:  # the scores are the logits: the mask itself
                    assert torch.equal(_top_p_remove_by_values(x.to(dtype), top_p),
                                       ~_top_p_keep_full(x.to(dtype), top_p))
            zeros = want[1][x[1] == 0.0]
            cut_inside += bool((zeros > float("-inf")).any() and (zeros == float("-inf")).any())
    assert cut_inside > 0  # the cut fell inside the tie group at least once
