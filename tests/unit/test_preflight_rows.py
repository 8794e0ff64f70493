"""Everything checkable is checked before Ray starts, dataset domains included: a single_turn domain without an
answer column under the warm start (naming data.columns.answer and train.warm_start.steps=0), a TRL reward that
asks for a column no split has, a verl compute_score without a ground truth, a reward function of no known shape,
a row function on a domain without rows — `rollart train` exits 2 with each named, before any Ray process starts,
and with no resume hint."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import yaml
from verl_data import write_verl_parquet

REWARDS = '''
def two_things(a, b):
    return 0.0

def by_row(response, row):
    return 0.0

def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    return 0.0
'''


def test_rollart_train_refuses_every_row_problem_before_ray_starts(tmp_path: Path) -> None:
    write_verl_parquet(tmp_path / "train.parquet", 10)
    (tmp_path / "jsonl.jsonl").write_text("".join(f'{{"q": "question {i}", "level": {i}}}\n' for i in range(10)))
    (tmp_path / "user_rewards.py").write_text(REWARDS)
    data = {"train": "jsonl.jsonl", "columns": {"prompt": "q"}}
    domain = {"env": "dataset", "pool": "gen_decode", "max_turns": 1, "max_new_tokens": 8, "max_total_tokens": 128}
    run = {"domains": {
        "frozenlake": None, "math": None,
        "no_answer": {**domain, "data": data, "reward": {"fn": "user_rewards:by_row"}},
        "trl_column": {**domain, "data": {"train": "train.parquet", "format": "verl"},
                       "reward": {"fn": "trl.rewards:accuracy_reward"}},  # asks for `solution`
        "verl_truth": {**domain, "data": data, "reward": {"fn": "user_rewards:compute_score"}},
        "shapeless": {**domain, "data": {**data, "columns": {"prompt": "q", "answer": "level"}},
                      "reward": {"fn": "user_rewards:two_things"}},
        "row_on_env": {"env": "frozenlake", "reward": {"fn": "user_rewards:by_row"}},
    }}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    ray_tmp = tmp_path / "ray"
    env = {**os.environ, "RAY_TMPDIR": str(ray_tmp), "TMPDIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-m", "rollart.cli", "train", "run.yaml", "run_dir=run"], cwd=tmp_path,
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 2, out.stderr[-3000:]
    err = out.stderr
    assert ("domains.no_answer.data.columns: the warm start (train.warm_start.steps=100) demonstrates every trained "
            "domain with its expert's answers, and a single_turn row's expert answer is its answer column, which is "
            "not mapped: map it (data.columns.answer: <column or a.b path>), or set train.warm_start.steps=0") in err
    assert "domains.trl_column.reward.fn: trl.rewards:accuracy_reward asks for 'solution' by name" in err
    assert "map one, e.g. data.columns.solution: <column or a.b path>" in err
    assert "domains.verl_truth.reward.fn: user_rewards:compute_score is a verl compute_score" in err
    assert "domains.shapeless.reward.fn: reward fn user_rewards:two_things(a, b) fits none of the shapes" in err
    assert "domains.row_on_env.reward.fn: user_rewards:by_row takes a dataset row (row=), but domain row_on_env is " \
           "not a dataset domain" in err
    assert "resume" not in err and "Traceback" not in err
    assert not ray_tmp.exists() and not any(tmp_path.glob("ray*")), "a Ray process started"
    assert not (tmp_path / "run").exists()


def test_an_input_error_found_after_start_gets_no_resume_hint() -> None:
    from rollart.cli.commands.train import input_error
    from rollart.envs.dataset import DataError
    from rollart.reward.shapes import RewardShapeError

    data = DataError("rows.jsonl row 3: episode 'single_turn' could not start")
    try:
        try:
            raise data
        except DataError as inner:
            raise RuntimeError("an env worker failed") from inner  # as it arrives through Ray
    except RuntimeError as outer:
        assert input_error(outer) is data
    assert isinstance(input_error(RewardShapeError("fits none")), RewardShapeError)
    assert input_error(RuntimeError("the GCS went away")) is None  # a resume may get past that
