"""`rollart bench algos` without running a training job: pieces are chosen algorithm by algorithm and never
repeated, a finished run's metrics are read into its record, and the summary says which algorithm learns."""

import json

import pytest

from benchmarks import algos
from benchmarks.registry import STUDY_OPTIONS, by_name
from rollart.algo import ALGORITHMS


def record(name, seed, first, final, filtered=0.0, kl=1e-4):
    return {"algorithm": name, "seed": seed, "first": first, "final": final,
            "curve": [[0, 0.0, first], [150, 100.0, (first + final) / 2], [300, 200.0, final]],
            "steps": 300, "tokens_per_s": 800.0, "groups_filtered_frac": filtered, "mismatch_kl": kl,
            "behaviour_kl": 2 * kl, "train_s": 0.4, "critic_s": 0.2 if name == "ppo" else None}


def test_it_is_registered_as_a_resumable_study():
    bench = by_name()["algos"]
    assert bench.study and {o.flag for o in bench.options} == {"--piece", "--report", "--lock"}
    assert bench.options == STUDY_OPTIONS  # the staleness study's, less its --steps


def test_pieces_run_algorithm_by_algorithm_and_are_never_repeated():
    done = [record("grpo", s, 0.3, 0.7) for s in algos.SEEDS]
    names = list(ALGORITHMS)
    assert algos.choose_piece("next", done) == (names[1], 0)
    assert algos.choose_piece("ppo/2", done) == ("ppo", 2)
    with pytest.raises(ValueError, match="already in the study"):
        algos.choose_piece("grpo/1", done)
    with pytest.raises(ValueError, match="NAME one of grpo"):
        algos.choose_piece("ppo2/0", done)
    every = [record(n, s, 0.3, 0.6) for n in names for s in algos.SEEDS]
    assert algos.choose_piece("next", every) == (None, -1)


def test_the_summary_says_who_learns_and_compares_with_grpo():
    runs = [record("grpo", s, 0.3, 0.7 + 0.01 * s) for s in algos.SEEDS]
    runs += [record("dapo", s, 0.3, 0.45, filtered=0.3) for s in algos.SEEDS]
    result = algos.summarize(runs, quick=False)
    rows = {r["algorithm"]: r for r in result.rows}
    assert rows["grpo"]["learns"] and not rows["dapo"]["learns"]
    assert rows["grpo"]["gain_mean"] == pytest.approx(0.41) and rows["dapo"]["groups_filtered_frac"] == 0.3
    assert result.ratios["final_score_dapo_vs_grpo"] == pytest.approx(0.45 / 0.71, rel=1e-3)
    target = rows["grpo"]["target"]
    assert target == pytest.approx(0.9 * 0.71, rel=1e-3) and rows["grpo"]["steps_to_score"] == 300
    assert rows["dapo"]["time_to_score_s"] is None
    assert "ppo/0" in result.data["missing"] and "grpo/0" not in result.data["missing"]


def test_a_finished_run_is_read_into_its_record(tmp_path):
    lines = [{"step": 0, "wall_s": 10.0, "eval/mean": 0.3},
             {"step": 0, "wall_s": 12.0, "train/loss": 0.1, "train/mismatch_kl": 2e-4, "time/train": 0.5,
              "rollout/tokens": 1000, "rollout/groups_completed": 9, "rollout/groups_filtered": 1},
             {"step": 1, "wall_s": 14.0, "train/loss": 0.1, "train/mismatch_kl": 4e-4, "time/train": 0.7,
              "rollout/tokens": 3000, "rollout/groups_completed": 18, "rollout/groups_filtered": 2},
             {"step": 2, "wall_s": 30.0, "eval/mean": 0.6}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    got = algos.read_run(tmp_path)
    assert got["first"] == 0.3 and got["final"] == 0.6 and got["curve"][-1] == [2, 20.0, 0.6]
    assert got["tokens_per_s"] == pytest.approx(4000 / 20.0) and got["groups_filtered_frac"] == pytest.approx(0.1)
    assert got["mismatch_kl"] == pytest.approx(3e-4) and got["train_s"] == pytest.approx(0.6)
    assert got["critic_s"] is None
