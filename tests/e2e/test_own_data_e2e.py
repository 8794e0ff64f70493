"""Bring your own data and reward, as they are: a Parquet file in verl's layout (the ground truth nested in
`reward_model`) trains 2 steps with a TRL-shaped reward (TRL's own `accuracy_reward`, called once per finished
group with the row's columns by name) and with a verl `compute_score` (its four arguments, a dict with "score");
and a reward function that always raises stops the run within 30 s of its first failure, with its traceback
once, what to fix, and no resume command."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from test_train_e2e import console_problems, metrics_by_step
from verl_data import write_verl_parquet

from rollart.base.run_dir import RunPaths

pytestmark = [pytest.mark.slow]

REWARDS = '''
import json, os, time

from trl.rewards import accuracy_reward

LOG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "calls.jsonl")


def _log(**record):
    with open(LOG, "a") as f:
        f.write(json.dumps(record) + "\\n")


def counted_accuracy(completions, solution, prompts, completion_ids, trainer_state, **kwargs):
    """TRL's own accuracy_reward, noting how it was called."""
    _log(kind="trl", n=len(completions), conversational=isinstance(completions[0], list),
         sources=kwargs["data_source"], step=trainer_state.global_step, ids=len(completion_ids[0]) > 0)
    return accuracy_reward(completions, solution, **kwargs)


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    """As verl's gsm8k scorer would: the last boxed answer against the ground truth."""
    _log(kind="verl", source=data_source, truth=ground_truth, index=extra_info["index"], turns=extra_info["num_turns"])
    answer = solution_str.rsplit("\\\\boxed{", 1)[-1].split("}", 1)[0].strip() if "\\\\boxed{" in solution_str else ""
    return {"score": float(answer == ground_truth), "answered": bool(answer)}


def always_raises(completions, ground_truth, **kwargs):
    with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "first_failure"), "a") as f:
        f.write(f"{time.time()}\\n")
    raise KeyError("ground_truth_typo")
'''

DOMAIN = {"env": "dataset", "pool": "gen_decode", "max_turns": 1, "max_new_tokens": 12, "max_total_tokens": 512}
SHORT = ["train.steps=2", "train.warm_start.steps=2", "eval.every=2", "eval.episodes_per_domain=8",
         "rollout.batch_size=8", "rollout.group_size=4", "observability.progress=plain",
         "observability.tensorboard=false"]


def setup(tmp_path: Path, domains: dict) -> None:
    write_verl_parquet(tmp_path / "train.parquet", 64)
    write_verl_parquet(tmp_path / "test.parquet", 6, "test", start=1000)
    (tmp_path / "user_rewards.py").write_text(REWARDS)
    (tmp_path / "run.yaml").write_text(yaml.safe_dump({"domains": {"frozenlake": None, "math": None, **domains}}))


def train(tmp_path: Path, *overrides: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "rollart.cli", "train", "run.yaml", "run_dir=run", *SHORT, *overrides],
                          cwd=tmp_path, capture_output=True, text=True, timeout=timeout)


def test_a_verl_parquet_trains_with_a_trl_reward_and_a_verl_compute_score(tmp_path: Path) -> None:
    data = {"train": "train.parquet", "validation": "test.parquet", "format": "verl",
            "columns": {"solution": "reward_model.ground_truth"}}
    setup(tmp_path, {"gsm_trl": {**DOMAIN, "data": data, "reward": {"fn": "user_rewards:counted_accuracy"}},
                     "gsm_verl": {**DOMAIN, "data": data, "reward": {"fn": "user_rewards:compute_score"}}})
    out = train(tmp_path)
    assert out.returncode == 0, f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    noise = console_problems(out.stdout + out.stderr)
    assert not noise, "the console shows:\n" + "\n".join(noise)
    summary = json.loads(RunPaths.of(tmp_path / "run").summary.read_text())
    assert summary["steps"] == 2 and set(summary["eval_last_by_domain"]) == {"gsm_trl", "gsm_verl"}
    assert "each row is scored once" in out.stderr + out.stdout  # 6 validation rows < 8 episodes
    calls = [json.loads(line) for line in (tmp_path / "calls.jsonl").read_text().splitlines()]
    trl, verl = [c for c in calls if c["kind"] == "trl"], [c for c in calls if c["kind"] == "verl"]
    assert {c["n"] for c in trl} >= {4} and all(c["conversational"] and c["ids"] for c in trl)
    assert all(c["sources"] == ["openai/gsm8k"] * c["n"] for c in trl)
    assert any(c["n"] == 1 for c in trl)  # evaluation: one episode at a time
    assert verl and all(c["source"] == "openai/gsm8k" and c["turns"] == 1 for c in verl)
    assert {c["index"] for c in verl} & set(range(1000, 1006))  # validation rows, their own extra_info
    m = metrics_by_step(tmp_path / "run")
    assert m[2]["reward/local/failures"] == 0 and m[2]["reward/local/requests"] > 0


def test_a_reward_that_always_raises_stops_the_run_within_30_s_with_its_traceback(tmp_path: Path) -> None:
    data = {"train": "train.parquet", "validation": "test.parquet", "format": "verl",
            "columns": {"ground_truth": "reward_model.ground_truth"}}
    setup(tmp_path, {"gsm": {**DOMAIN, "data": data, "reward": {"fn": "user_rewards:always_raises"}}})
    write_verl_parquet(tmp_path / "test.parquet", 40, "test", start=1000)  # 40 validation episodes, as in the issue
    out = train(tmp_path, "eval.episodes_per_domain=64")
    ended = time.time()
    assert out.returncode == 1, f"{out.stdout[-3000:]}\n{out.stderr[-5000:]}"
    first = float((tmp_path / "first_failure").read_text().split()[0])
    assert ended - first <= 30.0, f"stopped {ended - first:.1f} s after the reward function first raised"
    err = out.stderr
    assert "domain 'gsm' is broken" in err and "KeyError: 'ground_truth_typo'" in err
    assert err.count("Traceback (most recent call last)") == 1 and 'raise KeyError("ground_truth_typo")' in err
    assert "Fix the reward function domains.gsm.reward.fn" in err and "resume=true" not in err
    assert err.count("ground_truth_typo") <= 3  # said once, not once per episode
