"""The adaptive chain (issue 48): a confidence stop and transformers' heuristic length schedule.

Both change only how many drafts a chain proposes. Proven here: the exact law of
generation with a confidence stop (ragged chains) and with every length the schedule can
pick equals the target's (specdec.testing.ExactLaws, whole-program enumeration); the
schedule's step is exactly the constant chain of the length it picked; the length rule
(+2 after a fully accepted chain, -1 otherwise) and its reset; ragged batches; bad input.
"""

from __future__ import annotations

import attrs
import pytest
import torch

import specdec
from specdec.errors import InvalidConfigError
from specdec.models import CallableLM
from specdec.rng import RowStreams, TorchRandom
from specdec.sampling import SamplingConfig
from specdec.testing import ExactLaws, markov_pair
from specdec.tree import NodeKind, TreeAssembler
from specdec.tree_batch import PAD
from specdec.trees.chain import ChainTreeBuilder, chain_build
from specdec.trees.feed import DraftSpec, TreeFeed, drive
from specdec.trees.static import static_build, static_layout
from specdec.trees import OneTreeBuilder, build_tree, build_trees

T1 = SamplingConfig(temperature=1.0)
T0 = SamplingConfig(temperature=0.0)
EXACT = 1e-9


class ContextLM(CallableLM):
    """A CallableLM that exposes its committed context, as HFDraft does (the schedule's feedback)."""

    @property
    def committed_tokens(self) -> tuple[int, ...]:
        return tuple(self.draft_context)


def _fields(batch):
    return {k: getattr(batch, k) for k in ("tokens", "parents", "depths", "kinds", "draw_order", "weights", "num_nodes",
                                           "law_ids", "law_probs", "law_wor", "ancestors")}


# ------------------------------------------------------------------ bad input
@pytest.mark.parametrize("options, match", [
    ({"confidence": -0.1}, "confidence must be a number in \\[0, 1\\)"),
    ({"confidence": 1.0}, "confidence must be a number in \\[0, 1\\)"),
    ({"confidence": True}, "confidence must be a number"),
    ({"confidence": "0.4"}, "confidence must be a number"),
    ({"schedule": "heuristic_transient"}, "schedule must be one of 'constant', 'heuristic'"),
    ({"schedule": "heuristic", "depth": 5, "max_depth": 4}, r"max_depth \(4\) must be at least depth \(5\)"),
    ({"max_depth": 8}, "max_depth caps the heuristic schedule"),
    ({"schedule": "heuristic", "max_depth": 0}, "max_depth"),
])
def test_bad_options_are_refused(options, match):
    with pytest.raises((InvalidConfigError, ValueError), match=match):
        ChainTreeBuilder(**options)


def test_the_schedule_without_a_committed_context_is_refused_not_run_at_a_fixed_depth():
    draft = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 5), vocab_size=5)  # no committed_tokens
    draft.begin([0, 1])
    builder = ChainTreeBuilder(depth=2, schedule="heuristic")
    with pytest.raises(InvalidConfigError, match="reads each row's committed context from the draft"):
        build_trees(builder, torch.tensor([1]), draft, T1, TorchRandom.seeded(0))
    with pytest.raises(InvalidConfigError, match="a fed build \\(TreeFeed\\) has no draft"):
        TreeFeed(builder, torch.tensor([1]), T1, TorchRandom.seeded(0), DraftSpec(5))


def test_bounds():
    assert ChainTreeBuilder(depth=3).max_depth == 3
    assert ChainTreeBuilder(depth=3, confidence=0.4).max_nodes == 4
    assert ChainTreeBuilder(depth=3, schedule="heuristic").max_depth == 20  # transformers' num_assistant_tokens
    assert ChainTreeBuilder(depth=3, schedule="heuristic", max_depth=6).max_nodes == 7


# ------------------------------------------------------------------ exactness
# the draft's top probabilities (seed 7) are 0.47-0.66: the T = 0 thresholds cut some chains, not all
@pytest.mark.parametrize("sampling,depth,confidence", [
    (T1, 3, 0.3), (T1, 3, 0.5), (T1, 2, 0.45), (T1, 4, 0.35),
    (T0, 3, 0.5), (T0, 3, 0.6), (T0, 2, 0.55), (T0, 4, 0.5),
], ids=["T1-3-0.3", "T1-3-0.5", "T1-2-0.45", "T1-4-0.35", "T0-3-0.5", "T0-3-0.6", "T0-2-0.55", "T0-4-0.5"])
def test_confidence_stop_is_exact_and_stops(depth, confidence, sampling):
    """The whole-program law of generation with ragged confidence-stopped chains is the target's;
    and the setting does stop chains early (else the test would prove nothing new)."""
    target, draft = markov_pair(4, seed=7)
    lengths = []
    laws = ExactLaws(ChainTreeBuilder(depth=depth, confidence=confidence), specdec.get("verifier", "rejection-iid")(),
                     target, draft, sampling, on_tree=lambda tree: lengths.append(tree.num_draft_nodes))
    gap = laws.check([0], depth + 1)
    assert abs(gap.mass - 1.0) < 1e-9
    assert gap.error < EXACT, gap
    assert min(lengths) < depth <= max(lengths), sorted(set(lengths))


@pytest.mark.parametrize("sampling", [T1, T0], ids=["T1", "T0"])
@pytest.mark.parametrize("depth", [1, 2, 3, 4])
def test_every_length_the_schedule_picks_is_exact(depth, sampling):
    """The schedule picks a length from the history before the step (never from the step's own
    draws); each step is then the constant chain of that length (next test), exact at each length."""
    target, draft = markov_pair(4, seed=3)
    laws = ExactLaws(ChainTreeBuilder(depth=depth, confidence=0.3), specdec.get("verifier", "rejection-iid")(),
                     target, draft, sampling)
    assert laws.check([1], depth + 1).error < EXACT


def test_a_broken_stop_is_caught():
    """Power: a chain whose stop reads the token drawn below it (it drops a second draft equal to 0,
    keeping the recorded law) proposes from a law other than the one recorded: the law breaks."""

    @attrs.frozen
    class StopsOnTheNextDraw(OneTreeBuilder, ChainTreeBuilder):
        def build(self, root_token, draft, sampling, rng):
            tree = build_tree(ChainTreeBuilder(depth=2), root_token, draft, sampling, rng)
            if tree.num_nodes < 3 or int(tree.tokens[2]) != 0:
                return tree
            asm = TreeAssembler(root_token, tree.vocab_size)
            asm.add_sampled(0, int(tree.tokens[1]), tree.laws[tree.law_index[1]], weight=float(tree.weights[1]))
            return asm.build()

    target, draft = markov_pair(4, seed=7)
    laws = ExactLaws(StopsOnTheNextDraw(depth=2), specdec.get("verifier", "rejection-iid")(), target, draft, T1)
    assert laws.check([0], 3).error > 1e-6


# ------------------------------------------------------------- the tensor form
@pytest.mark.parametrize("sampling", [T1, T0], ids=["T1", "T0"])
def test_without_a_stop_the_adaptive_build_is_the_static_chain(sampling):
    """chain_build at a constant length and no threshold grows the static chain's trees, draw for draw."""
    table = torch.randn(6, 6, generator=torch.Generator().manual_seed(1))
    draft = CallableLM(lambda prefixes: torch.stack([table[p[-1]] for p in prefixes]), vocab_size=6)
    draft.begin_rows([[1, 2], [3, 4]])
    roots = torch.tensor([2, 4])
    paths = tuple((0,) * d for d in range(1, 4))
    want = drive(static_build(static_layout(paths), ChainTreeBuilder.shape(ChainTreeBuilder(depth=3))[1], roots,
                              DraftSpec(6), sampling, RowStreams([TorchRandom.seeded(5), TorchRandom.seeded(6)]),
                              construction=False), draft)
    draft.begin_rows([[1, 2], [3, 4]])
    got = drive(chain_build(roots, DraftSpec(6), sampling, RowStreams([TorchRandom.seeded(5), TorchRandom.seeded(6)]),
                            [3, 3]), draft)
    for key, value in _fields(want).items():
        assert torch.equal(value, _fields(got)[key]), key


def test_a_batch_of_chains_is_ragged_where_rows_stop():
    """Row 0's draft is sure of itself (never stops), row 1's is flat (stops after its first token):
    row 1's later slots are padding, invisible to the other row, and each tree validates."""
    V = 5

    def logits(prefixes):
        out = []
        for p in prefixes:
            sure = p[0] == 0  # row 0's prompt starts with 0
            out.append(torch.nn.functional.one_hot(torch.tensor((p[-1] + 1) % V), V).float() * (20.0 if sure else 0.0))
        return torch.stack(out)

    draft = CallableLM(logits, vocab_size=V)
    draft.begin_rows([[0, 1], [2, 3]])
    builder = ChainTreeBuilder(depth=4, confidence=0.4)
    batch = build_trees(builder, torch.tensor([1, 3]), draft, T1, RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)]))
    assert batch.num_nodes.tolist() == [5, 2]
    assert batch.kinds[1, 2:].tolist() == [PAD] * 3 and int(batch.kinds[1, 1]) == int(NodeKind.SAMPLED)
    assert batch.tokens[1, 2:].tolist() == [3, 3, 3]  # padding carries the root's token
    assert not batch.ancestors[0, 4, :].logical_xor(torch.ones(5, dtype=torch.bool)).any()
    assert batch.ancestors[1, 1].tolist() == [True, True, False, False, False]
    assert batch.ancestors[1, 3].tolist() == [False, False, False, True, False]  # padding sees itself only
    assert (batch.law_probs[1, 1:] == 0).all()  # the stopped row's last node records no law: it has no child
    batch.validate()


# ------------------------------------------------------------------ the schedule
def test_the_schedule_follows_transformers_rule():
    """+2 after a fully accepted chain, -1 otherwise (at least 1), at most max_depth; the chain built
    is the constant chain of that length; a new sequence starts again at depth."""
    V = 6
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(2))
    draft = ContextLM(lambda prefixes: torch.stack([table[p[-1]] for p in prefixes]), vocab_size=V)
    builder = ChainTreeBuilder(depth=2, schedule="heuristic", max_depth=5)
    draft.begin([0, 1])
    seen = []

    def step(accept_all: bool) -> None:
        root = draft.committed_tokens[-1]
        tree = build_trees(builder, torch.tensor([root]), draft, T1, TorchRandom.seeded(len(seen)))
        d = int(tree.num_nodes[0]) - 1
        seen.append(d)
        # the same step as the constant chain of the picked length
        draft.begin(list(draft.committed_tokens))
        same = build_trees(ChainTreeBuilder(depth=d), torch.tensor([root]), draft, T1, TorchRandom.seeded(len(seen) - 1))
        assert torch.equal(same.tokens, tree.tokens)
        chain = tree.tokens[0, 1:d + 1].tolist()
        emitted = chain + [0] if accept_all else chain[:d // 2] + [0]
        draft.commit(emitted)

    for accept_all in (True, True, True, False, False, False, False, True):
        step(accept_all)
    assert seen == [2, 4, 5, 5, 4, 3, 2, 1]
    draft.begin([3, 4])  # a new sequence: back to depth
    step(True)
    assert seen[-1] == 2


def test_schedule_greedy_generation_is_the_target_greedy_continuation():
    """End to end at T = 0 (an exact law: argmax decoding), with an HF draft and target whose
    acceptance varies, so the schedule moves both ways."""
    transformers = pytest.importorskip("transformers")
    from specdec.drafts.hf import HFDraft
    from specdec.generate import SpeculativeGenerator, autoregressive_generate
    from specdec.targets.hf import HFTarget

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1)
    target_model = transformers.LlamaForCausalLM(cfg).eval()
    draft_model = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():  # the draft: the target with noise, so some chains are accepted whole, some not
        for p, q in zip(draft_model.parameters(), target_model.parameters()):
            p.copy_(q + 0.002 * torch.randn_like(q))
    target, draft = HFTarget(target_model, cpu_linear=False), HFDraft(draft_model, cpu_linear=False)
    gen = SpeculativeGenerator(target=target, draft=draft, method="sd", depth=2, schedule="heuristic", max_depth=6)
    prompt = [1, 5, 9, 3]
    out = gen.generate(prompt, 40, sampling=T0, seed=0)
    want = autoregressive_generate(target, prompt, 40, sampling=T0, seed=0).tokens
    assert list(out.tokens) == list(want)
    attempted = list(out.stats.depth_attempted)
    assert len(attempted) > 2 and sum(attempted[2:]) > 0, attempted  # chains grew past the first length (2)


def test_a_stopped_chain_is_scored_as_the_levels_drawn_not_as_its_longest_length():
    """The target scores every slot of a batch: a chain that stops at level 1 of 20 has 2 slots, not 21."""
    draft = CallableLM(lambda prefixes: torch.zeros(len(prefixes), 8), vocab_size=8)  # q = 1/8 < 0.4: stops at once
    draft.begin_rows([[0, 1], [2, 3]])
    batch = build_trees(ChainTreeBuilder(depth=20, confidence=0.4),
        torch.tensor([1, 3]), draft, T1, RowStreams([TorchRandom.seeded(0), TorchRandom.seeded(1)]))
    assert batch.node_slots == 2 and batch.num_nodes.tolist() == [2, 2] and batch.max_depth == 1
    batch.validate()
