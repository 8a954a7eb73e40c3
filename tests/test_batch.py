"""Batched plain decoding (specdec.batch): per-row equality with batch-1 decoding, stops, streams, bad input."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).parent / "models"))
from hf_model_helpers import VOCAB, make_tiny_llama  # noqa: E402

import specdec  # noqa: E402
from specdec.batch import autoregressive_generate_batch, autoregressive_stream_batch  # noqa: E402
from specdec.errors import InvalidConfigError  # noqa: E402
from specdec.targets.hf import HFTarget  # noqa: E402

PROMPTS = [[3, 4], [5, 6, 7, 8, 9, 10, 11], [12], [13, 14, 15, 16]]


@pytest.fixture(scope="module")
def model():
    return make_tiny_llama("sdpa", torch.float64, seed=3)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_every_row_equals_its_batch_one_decoding(model, temperature):
    """Ragged prompts, one seed per row: each row emits what plain batch-1
    decoding emits for its prompt and seed (float64: the logits agree across
    batch sizes to rounding, and no uniform falls within it here)."""
    sampling = specdec.SamplingConfig(temperature=temperature)
    seeds = [7, 8, 9, 10]
    out = autoregressive_generate_batch(HFTarget(model), PROMPTS, 12, sampling, seeds)
    for b, prompt in enumerate(PROMPTS):
        ref = specdec.autoregressive_generate(HFTarget(model), prompt, 12, sampling, seed=seeds[b])
        assert list(out.tokens[b]) == ref.tokens
    assert out.steps == 12 and out.new_tokens == 48 and out.stop_reasons == ("length",) * 4


def test_rows_depend_on_their_own_seed_only(model):
    """Swapping two rows' seeds swaps their outputs (a row's stream is its own);
    the outputs of the other rows do not change."""
    sampling = specdec.SamplingConfig(temperature=1.0)
    a = autoregressive_generate_batch(HFTarget(model), [PROMPTS[0]] * 3, 16, sampling, [1, 2, 3])
    b = autoregressive_generate_batch(HFTarget(model), [PROMPTS[0]] * 3, 16, sampling, [3, 2, 1])
    assert a.tokens[0] == b.tokens[2] and a.tokens[2] == b.tokens[0] and a.tokens[1] == b.tokens[1]
    assert a.tokens[0] != a.tokens[2]


def test_rows_stop_on_their_own_eos_and_leave_the_batch(model, monkeypatch):
    sampling = specdec.SamplingConfig(temperature=0.0)
    free = autoregressive_generate_batch(HFTarget(model), PROMPTS, 10, sampling)
    eos = free.tokens[1][3]  # row 1 stops at its 4th token (or earlier, if it came before)
    target = HFTarget(model)
    kept = []
    original = HFTarget.keep_rows
    monkeypatch.setattr(HFTarget, "keep_rows", lambda self, rows: (kept.append(list(rows)), original(self, rows)))
    out = autoregressive_generate_batch(target, PROMPTS, 10, sampling, eos_token_id=[eos])
    for b in range(len(PROMPTS)):
        cut = next((i + 1 for i, t in enumerate(free.tokens[b]) if t == eos), None)
        assert list(out.tokens[b]) == list(free.tokens[b][:cut])
        assert out.stop_reasons[b] == ("eos" if cut is not None and cut <= 10 else "length")
    assert out.stop_reasons[1] == "eos" and kept  # a finished row left the batch
    chunks = list(autoregressive_stream_batch(HFTarget(model), PROMPTS, 3, sampling))
    assert len(chunks) == 3 and all(sorted(c) == [0, 1, 2, 3] for c in chunks)
    assert [sum((c[b] for c in chunks), []) for b in range(4)] == [list(t[:3]) for t in free.tokens]


def test_bad_input_is_refused_clearly(model):
    target = HFTarget(model)
    S = specdec.SamplingConfig()
    for prompts, match in [([], "non-empty list"), ("12", "non-empty list"), ([[1], []], "prompt 1"),
                           ([[1, 2.5]], "not an int"), ([torch.ones(2, 2, dtype=torch.long)], "1-D")]:
        with pytest.raises(InvalidConfigError, match=match):
            autoregressive_generate_batch(target, prompts, 4, S)
    with pytest.raises(InvalidConfigError, match="one per prompt"):
        autoregressive_generate_batch(target, [[1], [2]], 4, S, seeds=[1])
    with pytest.raises(InvalidConfigError, match="eos_token_id"):
        autoregressive_generate_batch(target, [[1]], 4, S, eos_token_id="13")
    with pytest.raises(InvalidConfigError, match="max_new_tokens"):
        autoregressive_generate_batch(target, [[1]], 0, S)
    with pytest.raises(ValueError, match="outside"):
        autoregressive_generate_batch(target, [[VOCAB]], 4, S)
    with pytest.raises(InvalidConfigError, match=r"row 1: prompt \(250\)"):  # the tiny model has 256 positions
        autoregressive_generate_batch(target, [[1, 2], [3] * 250], 8, S)
    from specdec.targets.base import TargetModel

    class OneRow(TargetModel):  # declares no batch mode (TargetModel.supports_batch)
        vocab_size = VOCAB
        prefill = score_tree = accept = lambda self, *args: None

    one_row = OneRow()  # no batch mode: served by one copy per row (specdec.adapters.TargetRowCopies)
    with pytest.raises(InvalidConfigError, match="max_new_tokens"):  # still checked before any copy or forward
        autoregressive_generate_batch(one_row, [[1], [2]], 0, S)
    with pytest.raises(InvalidConfigError, match="must be a TargetModel"):
        autoregressive_generate_batch(object(), [[1]], 4, S)


# ----------------------------------------------------------- speculative rows
def _eagle_pair(version: int, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.train.trainer import new_head

    torch.manual_seed(seed)
    cfg = LlamaConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
                      num_key_value_heads=2, vocab_size=61, max_position_embeddings=256)
    model = LlamaForCausalLM(cfg).double().eval()
    vocab = torch.arange(1, 61, 2) if version == 3 else None
    head = new_head(model, version, draft_vocab=vocab, seed=version)
    with torch.no_grad():  # random, non-trivial weights everywhere
        for p in head.parameters():
            p.add_(0.3 * torch.randn_like(p))
    head = head.double()
    return model, head


def _eagle_generator(model, head, method, **options):
    from specdec.drafts.eagle import make_draft

    draft = make_draft(head)
    target = HFTarget(model, capture_layers=draft.target_layers)
    return specdec.SpeculativeGenerator(target=target, draft=draft, method=method, **options)


ROW_PROMPTS = [[3, 4, 5], [7], [9, 10, 11, 12, 13, 14, 15], [20, 21]]


@pytest.mark.parametrize("method,version", [("eagle3", 3), ("eagle2", 2), ("rheo", 3)])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculative_rows_equal_their_batch_one_generation(method, version, temperature):
    """Every row of a batched speculative generation (ragged prompts, rows
    finishing at different steps) equals its batch-1 generation with its seed,
    token for token (float64 models: the logits agree across batch sizes)."""
    model, head = _eagle_pair(version)
    sampling = specdec.SamplingConfig(temperature=temperature)
    seeds = [11, 12, 13, 14]
    gen = _eagle_generator(model, head, method)
    out = gen.generate_batch(ROW_PROMPTS, 14, sampling, seeds)
    single = _eagle_generator(model, head, method)
    for b, prompt in enumerate(ROW_PROMPTS):
        ref = single.generate(prompt, 14, sampling, seed=seeds[b])
        assert list(out.tokens[b]) == ref.tokens, f"row {b}"
    assert out.tau > 1.0 and out.row_steps >= out.steps


@pytest.mark.parametrize("method", ["eagle3", "rheo"])
def test_counter_stream_rows_equal_their_batch_one_generation(method):
    """random="counter" on the torch step path: row b's builder and verifier
    draw from CounterRandom.seeded(seeds[b]) (all rows' Philox tables in one
    set of ops, RowStreams) and equal its batch-1 generation with that seed;
    the kernel path is tested in tests/kernels/test_batch_kernel.py."""
    model, head = _eagle_pair(3)
    sampling = specdec.SamplingConfig(temperature=1.0)
    seeds = [11, 12, 2**64 - 3, 14]
    out = _eagle_generator(model, head, method, random="counter").generate_batch(ROW_PROMPTS, 12, sampling, seeds)
    single = _eagle_generator(model, head, method, random="counter")
    for b, prompt in enumerate(ROW_PROMPTS):
        assert list(out.tokens[b]) == single.generate(prompt, 12, sampling, seed=seeds[b]).tokens, f"row {b}"
    torch_rows = _eagle_generator(model, head, method).generate_batch(ROW_PROMPTS, 12, sampling, seeds)
    assert out.tokens != torch_rows.tokens  # another stream: other samples (the test sees the stream)


def _lm_generator(method: str, **options):
    """A float64 tiny-Llama target with an independent 1-layer draft LM (HFDraft)."""
    from specdec.drafts.hf import HFDraft

    target_model = make_tiny_llama("sdpa", torch.float64, seed=3)
    draft_model = make_tiny_llama("sdpa", torch.float64, seed=4, layers=1)
    return lambda: specdec.SpeculativeGenerator(target=HFTarget(target_model), draft=HFDraft(draft_model),
                                                method=method, **options)


def _rows_equal_batch_one(gen, sampling, seeds, max_new):
    out = gen().generate_batch(PROMPTS, max_new, sampling, seeds)
    single = gen()
    for b, prompt in enumerate(PROMPTS):
        assert list(out.tokens[b]) == single.generate(prompt, max_new, sampling, seed=seeds[b]).tokens, f"row {b}"
    return out


@pytest.mark.parametrize("method", ["eagle2", "rheo"])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_draft_lm_rows_equal_their_batch_one_generation(method, temperature):
    """An independent Hugging Face draft LM in rows mode (HFDraft.begin_rows):
    every row equals its batch-1 generation with its seed, token for token
    (float64 models), through ragged prompts and rows finishing early."""
    gen = _lm_generator(method, K=2, depth=3, N=5)
    sampling = specdec.SamplingConfig(temperature=temperature)
    seeds = [5, 6, 7, 8]
    out = _rows_equal_batch_one(gen, sampling, seeds, 12)
    eos = out.tokens[1][3]
    stopped = gen().generate_batch(PROMPTS, 12, sampling, seeds, eos_token_id=eos)
    for b in range(len(PROMPTS)):
        cut = next((i + 1 for i, t in enumerate(out.tokens[b]) if t == eos), None)
        assert list(stopped.tokens[b]) == list(out.tokens[b][:cut])


@pytest.mark.parametrize("method,options", [
    ("sd", {"depth": 3}),
    ("specinfer", {"expansion": (2, 2, 1)}),
    ("specinfer", {"expansion": (3, 1), "mode": "wor", "verifier": "rejection-wor"}),
    ("sequoia", {"num_nodes": 5, "max_depth": 3, "acceptance": (0.5, 0.2, 0.1)}),
])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_shaped_builder_rows_equal_their_batch_one_generation(method, options, temperature):
    """The shaped builders (chain, static, Sequoia) grow B trees in one set of
    tensor ops (grow_static over a rows-mode draft): every row equals its
    batch-1 generation with its seed (float64 models), i.i.d. and
    without-replacement siblings alike."""
    out = _rows_equal_batch_one(_lm_generator(method, **options), specdec.SamplingConfig(temperature=temperature),
                                [21, 22, 23, 24], 10)
    assert out.tau >= 1.0


def test_speculative_rows_stop_leave_and_stream():
    model, head = _eagle_pair(3)
    sampling = specdec.SamplingConfig(temperature=0.0)
    gen = _eagle_generator(model, head, "eagle3")
    free = gen.generate_batch(ROW_PROMPTS, 12, sampling)
    eos = free.tokens[2][2]
    out = gen.generate_batch(ROW_PROMPTS, 12, sampling, eos_token_id=eos)
    for b in range(len(ROW_PROMPTS)):
        cut = next((i + 1 for i, t in enumerate(free.tokens[b]) if t == eos), None)
        assert list(out.tokens[b]) == list(free.tokens[b][:cut])
    assert out.stop_reasons[2] == "eos"
    streamed = [[] for _ in ROW_PROMPTS]
    for chunk in gen.stream_batch(ROW_PROMPTS, 12, sampling):
        for r, new in chunk.items():
            streamed[r].extend(new)
    assert [tuple(s) for s in streamed] == list(free.tokens)


def test_speculative_rows_refuse_what_they_cannot_run():
    model, head = _eagle_pair(3)
    gen = _eagle_generator(model, head, "eagle3")
    with pytest.raises(InvalidConfigError, match="one per prompt"):
        gen.generate_batch([[1], [2]], 4, seeds=[1])
    from specdec.drafts.hf import HFDraft

    from specdec.trees.chain import ChainTreeBuilder
    from specdec.verify.rejection import RejectionIIDVerifier

    from specdec.trees import OneTreeBuilder, build_tree

    class PerNode(OneTreeBuilder, ChainTreeBuilder):  # a builder that writes build(): it grows one tree at a time
        def build(self, root_token, draft, sampling, rng):
            return build_tree(ChainTreeBuilder(depth=self.depth), root_token, draft, sampling, rng)

    from specdec.batch import speculative_stream_batch

    # a builder that only builds host trees runs in batches through the adapters (specdec.adapters.host_feed)
    rows = [[], []]
    for chunk in speculative_stream_batch(HFTarget(model), HFDraft(model), PerNode(depth=2), RejectionIIDVerifier(),
                                          [[1], [2]], 4, specdec.SamplingConfig()):
        for r, new in chunk.items():
            rows[r].extend(new)
    assert [len(r) for r in rows] == [4, 4]
    from specdec.drafts.eagle import make_draft

    with pytest.raises(InvalidConfigError, match="not supported with batches"):
        specdec.SpeculativeGenerator(target=HFTarget(model, capture_layers=head.config.target_layers),
                                     draft=make_draft(head), method="eagle3", compile=True).generate_batch([[1]], 4)
    from specdec.verify.kseq import KSeqVerifier

    for kernel, match in (("cuda", "kernel must be"), ("triton", "no fused kernel")):
        with pytest.raises(InvalidConfigError, match=match):  # before any forward
            next(speculative_stream_batch(HFTarget(model), HFDraft(model), ChainTreeBuilder(depth=2),
                                          KSeqVerifier(), [[1], [2]], 4, specdec.SamplingConfig(), kernel=kernel))
    with pytest.raises(InvalidConfigError, match="random must be"):
        next(speculative_stream_batch(HFTarget(model), HFDraft(model), ChainTreeBuilder(depth=2), RejectionIIDVerifier(),
                                      [[1], [2]], 4, specdec.SamplingConfig(), random="philox"))


def test_per_row_counts_add_up():
    model, head = _eagle_pair(3)
    out = _eagle_generator(model, head, "eagle3").generate_batch(ROW_PROMPTS, 10, specdec.SamplingConfig(temperature=1.0))
    assert sum(out.steps_by_row) == out.row_steps and max(out.steps_by_row) == out.steps
    assert abs(sum(out.emitted_by_row) / out.row_steps - out.tau) < 1e-12
    assert all(e >= len(t) for e, t in zip(out.emitted_by_row, out.tokens))


def test_a_batched_step_makes_one_host_read_and_copies_nothing_to_the_device():
    """Counted with StepCounter (hardware-free): over a batched generation the
    only host-sync site that fires every step is the step's one read; the rest
    (prefill, rows leaving the batch) happen a few times per generation."""
    from specdec.testing.counter import StepCounter

    model, head = _eagle_pair(3)
    for run in (
        lambda: _eagle_generator(model, head, "rheo").generate_batch(ROW_PROMPTS, 20, specdec.SamplingConfig(temperature=1.0)),
        lambda: _eagle_generator(model, head, "rheo", random="counter").generate_batch(  # per-row Philox streams
            ROW_PROMPTS, 20, specdec.SamplingConfig(temperature=1.0)),
        lambda: autoregressive_generate_batch(HFTarget(model), ROW_PROMPTS, 20, specdec.SamplingConfig(temperature=1.0)),
    ):
        run()
        with StepCounter(ops=False) as counter:
            out = run()
        sites = counter.sync_sites["step"]
        every_step = [(kind, site) for (kind, site), n in sites.items() if n >= out.steps]
        assert len(every_step) == 1 and every_step[0][0] == "read", sites
        assert sum(n for key, n in sites.items() if key not in every_step) <= 15, sites
