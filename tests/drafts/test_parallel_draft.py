"""The parallel draft form (docs/drafts.md, "Parallel drafts"): declared, checked, and the toy draft."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import cast

import pytest
import torch

from specdec.draft_request import DraftRequest
from specdec.drafts.base import DraftModel
from specdec.drafts.parallel import ParallelDraft
from specdec.drafts.setting import DraftSetting
from specdec.errors import InvalidConfigError, PluginError
from specdec.registry import register, unregister
from specdec.testing import sparse_markov_pair
from specdec.testing.draft_suites import draft_cases
from specdec.testing.markov import MarkovLM
from specdec.testing.parallel import MarginalMarkovDraft, markov_marginals
from specdec.testing.suites import Failure, Skipped, SuiteSettings
from specdec.trees.feed import DraftSpec


def _enumerated(table: torch.Tensor, context: list[int], depth: int) -> torch.Tensor:
    """``[depth, V]`` the marginals by enumerating every path (the reference of markov_marginals)."""
    probs = torch.softmax(table.double(), dim=-1)
    V, order = int(table.shape[-1]), table.dim() - 1
    out = torch.zeros(depth, V, dtype=torch.float64)
    for path in itertools.product(range(V), repeat=depth):
        seq, weight = list(context), 1.0
        for token in path:
            weight *= float(probs[tuple(seq[-order:])][token])
            seq.append(token)
        for d, token in enumerate(path):  # the whole path's probability, at each of its positions
            out[d, token] += weight
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_marginals_equal_the_enumerated_paths(seed: int) -> None:
    _, draft = sparse_markov_pair(3, seed, ties=seed % 2 == 1)
    for context in ([0, 1], [2, 2, 0]):
        got = markov_marginals(draft.table, context, 3)
        assert torch.allclose(got, _enumerated(draft.table, context, 3), atol=1e-12)
        assert torch.allclose(got.sum(-1), torch.ones(3, dtype=torch.float64))


def test_block_rows_equal_one_row_answers_and_the_first_position_is_the_root_law() -> None:
    _, markov = sparse_markov_pair(4, 0)
    prompts = [[0, 1], [2, 3, 1], [3, 0, 0, 2]]
    rows = MarginalMarkovDraft(markov.table, block_size=3)
    rows.begin_rows(prompts)
    block = rows.request_logits(DraftRequest(0, 3, 4, False, block=3))  # [3, 3, 4]
    assert block.shape == (3, 3, 4)
    for b, prompt in enumerate(prompts):
        one = MarginalMarkovDraft(markov.table, block_size=3)
        one.begin(prompt)
        alone = one.request_logits(DraftRequest(0, 1, 4, False, block=2))[0]  # a shorter block: its prefix
        assert torch.equal(alone, block[b, :2])
        assert torch.allclose(block[b, 0].softmax(-1), one.root_logits().softmax(-1))
    # the block after commits is the block of a draft begun on the longer contexts
    rows.commit_rows([[1], [0, 2], [3]])
    again = rows.request_logits(DraftRequest(0, 3, 4, False, block=1))
    for b, (prompt, new) in enumerate(zip(prompts, [[1], [0, 2], [3]])):
        assert torch.allclose(again[b, 0].exp(), markov_marginals(markov.table, prompt + new, 1)[0])


def test_a_block_longer_than_the_draft_s_is_refused_naming_block_size() -> None:
    _, markov = sparse_markov_pair(3, 0)
    draft = MarginalMarkovDraft(markov.table, block_size=2)
    draft.begin([0, 1])
    with pytest.raises(InvalidConfigError, match=r"block=3.*block_size is 2"):
        draft.request_logits(DraftRequest(0, 1, 3, False, block=3))
    assert DraftSpec.of(draft).block_size == 2
    with pytest.raises(InvalidConfigError, match="block_size must be an integer >= 1"):
        MarginalMarkovDraft(markov.table, block_size=0)


def test_an_autoregressive_draft_has_no_parallel_form() -> None:
    _, markov = sparse_markov_pair(3, 0)
    markov.begin([0, 1])
    assert DraftSpec.of(markov).block_size == 0
    with pytest.raises(InvalidConfigError, match="has no parallel form"):
        markov.request_logits(DraftRequest(0, 1, 3, False, block=1))


def test_the_parallel_form_without_its_members_fails_when_the_class_is_defined() -> None:
    with pytest.raises(PluginError, match="has the parallel form .ParallelDraft. but does not implement block_size, "
                                          "block_rows_logits"):
        class Half(MarkovLM, ParallelDraft):  # the Markov chain's one-row form, no block
            pass

    with pytest.raises(PluginError, match=r"does not implement block_rows_logits \("):
        class NoLaws(ParallelDraft):
            @property
            def block_size(self) -> int:
                return 2


def test_the_batch_contract_stays_small_and_declares_the_form() -> None:
    assert not {"block_size", "block_rows_logits"} & set(vars(DraftModel))  # the form's members are its own
    assert DraftModel.parallel_form is False and ParallelDraft.parallel_form is True
    assert MarginalMarkovDraft.parallel_form and isinstance(MarginalMarkovDraft(torch.zeros(2, 2)), ParallelDraft)


def test_block_logits_of_the_wrong_shape_are_a_clear_error() -> None:
    _, markov = sparse_markov_pair(3, 0)

    class Short(MarginalMarkovDraft):
        def block_rows_logits(self, depth: int, proposal: bool = False) -> torch.Tensor:
            return super().block_rows_logits(depth, proposal)[:, :-1]

    draft = Short(markov.table, block_size=3)
    draft.begin([0, 1])
    with pytest.raises(Exception, match=r"shape \(1, 1, 3\).*expected \[1, 2, 3\]"):
        draft.request_logits(DraftRequest(0, 1, 3, False, block=2))


def _run(name: str, factory: Callable[[DraftSetting], DraftModel], cls: type[DraftModel],
         suites: tuple[str, ...] = ("laws", "rows", "whole-tree")) -> dict[str, list[str]]:
    """The parallel-form conformance cases of ``cls`` registered as ``name`` (of ``suites``):
    ``{outcome: [case ids]}``."""
    register("draft", name, factory=factory)(cls)
    try:
        out: dict[str, list[str]] = {"fail": [], "skip": [], "pass": []}
        for case in draft_cases(name, SuiteSettings(table_seeds=1)):
            if "parallel" not in case.id or case.suite not in suites or (
                    case.suite == "whole-tree" and " T1 " not in case.id):  # (every sampling: tests/trees/test_ddtree.py)
                continue
            result = case.check()
            key = "fail" if isinstance(result, Failure) else "skip" if isinstance(result, Skipped) else "pass"
            out[key].append(case.id if result is None else f"{case.id}: {result}")
        return out
    finally:
        unregister("draft", name)


class _Toy(MarginalMarkovDraft):
    pass


class _OneContext(MarginalMarkovDraft):
    """Broken: in rows mode every row's block is row 0's."""

    def block_rows_logits(self, depth: int, proposal: bool = False) -> torch.Tensor:
        out = super().block_rows_logits(depth, proposal)
        return out[:1].expand_as(out).clone()


class _Unnormalised(MarginalMarkovDraft):
    """Broken: position 2 of the block is NaN."""

    def block_rows_logits(self, depth: int, proposal: bool = False) -> torch.Tensor:
        out = super().block_rows_logits(depth, proposal)
        out[:, 1:2] = float("nan")
        return out


def _factory(cls: type[MarginalMarkovDraft]) -> Callable[[DraftSetting], DraftModel]:
    return lambda s: cls(cast(MarkovLM, s.target).table, block_size=3)


def test_the_conformance_cases_of_a_parallel_draft_pass_and_have_power() -> None:
    good = _run("test-toy-parallel", _factory(_Toy), _Toy)
    assert not good["fail"] and not good["skip"], good
    assert any("ddtree-match" in c for c in good["pass"]) and any("block rows" in c for c in good["pass"])
    rows = _run("test-one-context", _factory(_OneContext), _OneContext, ("rows",))
    assert any("parallel block rows" in c and "alone gives" in c for c in rows["fail"]), rows
    laws = _run("test-unnormalised", _factory(_Unnormalised), _Unnormalised, ("laws",))
    assert any("position 2 has non-finite entries" in c for c in laws["fail"]), laws
