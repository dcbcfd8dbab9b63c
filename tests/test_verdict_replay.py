"""Today's verdict rules replayed on the measurements of recorded analyze runs (issue 41).

``python -m benchmarks stability --json docs/bench/stability.json`` keeps, beside each run's
verdict, the :class:`Measurements` it was decided from. A rule changed since is judged on the
same numbers here: every folder must still get one bottleneck and one recommended output over
its quiet and busy runs. No timing: the measurements are data."""

import json
import os

import pytest

from benchmarks.stability import replay, runs_of

RECORD = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "docs", "bench",
                      "stability.json")


def recorded():
    with open(RECORD) as f:
        return runs_of(json.load(f))


def test_the_record_holds_what_each_verdict_was_decided_from():
    runs = [r for folder in recorded().values() for r in folder]
    assert len(runs) >= 18 and all("measurements" in r for r in runs)
    assert {r["load"] for r in runs} == {0, 2}  # quiet and busy runs


@pytest.mark.parametrize("folder", sorted(recorded()))
def test_each_folder_keeps_one_bottleneck_and_one_fix_on_its_recorded_runs(folder):
    verdicts = [replay(r) for r in recorded()[folder]]
    assert len({v.bottleneck for v in verdicts}) == 1, [v.summary for v in verdicts]
    assert len({v.recommended for v in verdicts}) == 1, [(v.recommended, v.equal_alternatives) for v in verdicts]
    assert all(v.recommended for v in verdicts)
