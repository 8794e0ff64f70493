"""`rollart bench async --arm`: each arm run on its own is added to the file, the arms already there kept, and the
ratios come once both are in it (the arms' runs themselves are real training runs: `rollart bench async`)."""

import json

import pytest

from benchmarks import async_training
from benchmarks.common import to_json


def fake_arm(arm: str, quick: bool, steps: int | None = None, seed: int = 0) -> dict:
    step = {"async": 1.0, "sync": 2.0}[arm]
    curve = {"async": [(0.0, 0.3), (10.0, 0.6), (20.0, 0.8)], "sync": [(0.0, 0.3), (30.0, 0.6)]}[arm]
    return {"row": {"arm": arm, "seed": seed, "mean_step_s": step}, "curve": curve}


def seeded_arm(arm: str, quick: bool, steps: int | None = None, seed: int = 0) -> dict:
    """Seed s: sync reaches 0.6 at 10·(s+1) s, async always at 10 s; sync's step is 1 + s."""
    if arm == "async":
        return {"row": {"arm": arm, "seed": seed, "mean_step_s": 1.0}, "curve": [(0.0, 0.3), (10.0, 0.6)]}
    return {"row": {"arm": arm, "seed": seed, "mean_step_s": 1.0 + seed},
            "curve": [(0.0, 0.3), (10.0 * (seed + 1), 0.6)]}


def test_arms_gather_in_one_file_and_the_ratios_come_with_the_second(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(async_training, "run_arm", fake_arm)
    path = tmp_path / "async.json"
    first = async_training.run(False, json_path=str(path), arm="sync")
    assert first.ratios == {} and "run the others with --arm" in first.notes[0]
    path.write_text(json.dumps(to_json(first, False, ["bench", "async"])))
    second = async_training.run(False, json_path=str(path), arm="async")
    assert second.ratios["async_vs_sync_step_time"] == 2.0
    assert second.ratios["async_vs_sync_time_to_score"] == 3.0  # target 0.6: sync at 30 s, async at 10 s
    assert [r["arm"] for r in second.rows] == ["async", "sync"]


def test_an_arm_needs_the_file_and_a_known_name(tmp_path) -> None:
    with pytest.raises(ValueError, match="needs --json"):
        async_training.run(False, arm="async")
    with pytest.raises(ValueError, match="one of"):
        async_training.run(False, json_path=str(tmp_path / "x.json"), arm="both")


def test_seeds_run_each_pair_in_turn_and_the_ratios_are_the_pairs_medians(monkeypatch) -> None:
    calls: list[tuple[str, int]] = []

    def arm(arm: str, quick: bool, steps: int | None = None, seed: int = 0) -> dict:
        calls.append((arm, seed))
        return seeded_arm(arm, quick, steps, seed)

    monkeypatch.setattr(async_training, "run_arm", arm)
    result = async_training.run(False, seeds=3)
    assert calls == [("async", 0), ("sync", 0), ("async", 1), ("sync", 1), ("async", 2), ("sync", 2)]
    assert result.ratios == {"async_vs_sync_step_time": 2.0, "async_vs_sync_time_to_score": 2.0}
    assert [p["ratios"]["async_vs_sync_time_to_score"] for p in result.data["seeds"]] == [1.0, 2.0, 3.0]
    assert [(r["arm"], r["seed"]) for r in result.rows] == calls
    assert "seed 2: step time 3.00, time to score 3.00" in result.notes[3]


def test_one_arm_does_not_combine_with_seeds(tmp_path) -> None:
    with pytest.raises(ValueError, match="does not combine with --seeds 2"):
        async_training.run(False, json_path=str(tmp_path / "x.json"), arm="async", seeds=2)
