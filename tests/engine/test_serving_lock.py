"""The serving call decides through the step's decision path (issue 56, deliverable 4) and gives,
draw for draw, what its own executor gave: every case of ``tests/engine/_serving_cases.py`` must
give the accepted slots, tokens, counts, flags and path recorded with the previous executor
(``tests/engine/data/serving_lock.json``, commit 9369fe7), and leave every row's source where it
left it (the next draw of each source is locked too)."""

from __future__ import annotations

import json

import pytest

from tests.engine._serving_cases import LOCK, case_ids, run

RECORDED = json.loads(LOCK.read_text())


def test_the_lock_covers_every_case():
    assert sorted(RECORDED) == sorted(case_ids())


@pytest.mark.parametrize("case_id", case_ids())
def test_serving_gives_what_it_gave(case_id):
    assert run(case_id) == RECORDED[case_id]
