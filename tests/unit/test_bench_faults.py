"""The chaos bench's fault plan: one fault per kind, at distinct seeded steps inside the RL phase."""

import json

import pytest

from benchmarks.faults import KINDS, logged_steps, plan


def test_the_plan_is_seeded_spread_and_inside_the_run():
    kinds = ["inference", "env", "reward", "trainer", "node"]
    a, b = plan(kinds, steps=20, seed=3), plan(kinds, steps=20, seed=3)
    assert a == b and sorted(f.kind for f in a) == sorted(kinds)
    steps = [f.after_step for f in a]
    assert len(set(steps)) == 5 and min(steps) >= 1 and max(steps) <= 18
    assert all(0 <= f.delay_frac < 1 for f in a)
    assert [f.kind for f in plan(kinds, 20, seed=4)] != [f.kind for f in a] or plan(kinds, 20, 4) != a
    with pytest.raises(ValueError, match="unknown fault kinds"):
        plan(["gremlin"], 20, 0)
    with pytest.raises(ValueError, match="need at least"):
        plan(list(KINDS), 5, 0)


def test_logged_steps_reads_step_records_and_skips_a_torn_line(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"step": 0, "time": 5.0, "eval/mean": 0.1}) + "\n"
                    + json.dumps({"step": 0, "time": 6.0, "time/step": 1.0}) + "\n"
                    + json.dumps({"step": 1, "time": 7.5, "time/step": 1.5}) + "\n" + '{"step": 2, "ti')
    assert logged_steps(path) == [(0, 6.0), (1, 7.5)]
    assert logged_steps(tmp_path / "missing.jsonl") == []
