"""pass@k / avg@n: the unbiased estimator against its closed form and against brute force over every k-subset,
the k reported, and an evaluation run end to end through the real `evaluate` with a runner and scorer that
pass exactly the samples we choose (the env and reward planes have their own contract tests)."""

import asyncio
import itertools
import math
from dataclasses import dataclass, field

import pytest

from rollart.config.loader import load_config
from rollart.job.evaluation import evaluate, pass_at_k, pass_ks
from rollart.types import RewardResult, Status, Task, Trajectory, Turn


@pytest.mark.parametrize("n", range(1, 9))
def test_the_estimator_equals_the_binomial_closed_form_and_brute_force(n):
    for c in range(n + 1):
        for k in range(1, n + 1):
            closed = 1 - math.comb(n - c, k) / math.comb(n, k)
            passes = [1] * c + [0] * (n - c)
            brute = sum(any(s) for s in itertools.combinations(passes, k)) / math.comb(n, k)
            assert pass_at_k(n, c, k) == pytest.approx(closed, abs=1e-12) == pytest.approx(brute, abs=1e-12)


def test_large_n_is_stable_and_bad_arguments_are_refused():
    assert pass_at_k(1000, 10, 1) == pytest.approx(0.01)
    assert pass_at_k(1000, 1, 500) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="k ≤ n"):
        pass_at_k(4, 1, 5)


def test_the_ks_reported():
    assert pass_ks(0) == [] and pass_ks(1) == [1] and pass_ks(4) == [1, 2, 4] and pass_ks(6) == [1, 2, 4, 6]


@dataclass
class Runner:
    temperatures: list = field(default_factory=list)

    async def run(self, task: Task, start_version: int) -> Trajectory:
        self.temperatures.append(task.temperature)
        turn = Turn((1,), (2,), (-0.1,), (start_version,))
        return Trajectory(task.trajectory_id, task, start_version, turns=(turn,)).finished(Status.COMPLETED)


class Scorer:
    """Episode i's sample j passes iff j < i (so episode 0 never, episode 3 three of four); greedy: 0.5;
    the sample s2 of episode 1 fails for an infrastructure reason."""

    async def score(self, trajectory: Trajectory) -> RewardResult:
        parts = trajectory.trajectory_id.split("/")
        if parts[-1].startswith("s"):
            episode, sample = int(parts[-2]), int(parts[-1][1:].split("~")[0])
            if episode == 1 and sample == 2:
                return RewardResult(trajectory.trajectory_id, 0.0, ok=False, error="down")
            return RewardResult(trajectory.trajectory_id, 1.0 if sample < episode else 0.2)
        return RewardResult(trajectory.trajectory_id, 0.5)


def test_an_evaluation_reports_pass_at_k_and_avg_beside_the_greedy_score():
    cfg = load_config(None, ["domains.frozenlake=null", "eval.episodes_per_domain=4", "eval.samples=4",
                             "eval.sample_temperature=0.7", "eval.retries=0"])
    runner = Runner()
    result = asyncio.run(evaluate(cfg, runner, Scorer(), 0, "t"))
    assert result.scores == {"math": 0.5} and result.scored == {"math": 4}
    assert runner.temperatures.count(0.7) == 16 and runner.temperatures.count(None) == 4
    # episodes: 0 → 0/4 pass, 1 → 1/3 scored pass (s2 failed), 2 → 2/4, 3 → 3/4
    expected = {k: sum(pass_at_k(n, c, k) for n, c in [(4, 0), (3, 1), (4, 2), (4, 3)] if n >= k)
                / sum(1 for n in (4, 3, 4, 4) if n >= k) for k in (1, 2, 4)}
    assert result.pass_at_k["math"] == pytest.approx(expected)
    scores = [0.2] * 4 + [1.0, 0.2, 0.2] + [1.0, 1.0, 0.2, 0.2] + [1.0, 1.0, 1.0, 0.2]
    assert result.avg_at_n["math"] == pytest.approx(sum(scores) / len(scores))


def test_without_samples_nothing_more_runs():
    cfg = load_config(None, ["domains.frozenlake=null", "eval.episodes_per_domain=3"])
    runner = Runner()
    result = asyncio.run(evaluate(cfg, runner, Scorer(), 0, "t"))
    assert len(runner.temperatures) == 3 and result.pass_at_k == {} and result.avg_at_n == {}


def test_a_task_temperature_overrides_its_splits():
    from rollart.config import RunConfig
    from rollart.envs.sampling import domain_sampling

    cfg = RunConfig()
    assert domain_sampling(cfg, "math", (1,), "val").temperature == cfg.eval.temperature == 0.0
    assert domain_sampling(cfg, "math", (1,), "val", 0.7).temperature == 0.7
    assert domain_sampling(cfg, "math", (1,), "train").temperature == cfg.rollout.temperature


def test_the_recorder_logs_pass_at_k_and_avg_beside_the_score(tmp_path):
    import time

    from rollart.config import RunConfig
    from rollart.job.recorder import RunRecorder
    from rollart.observability.records import read_metrics
    from rollart.base.run_dir import RunPaths
    from rollart.types import Evaluation

    cfg = RunConfig(run_dir=str(tmp_path / "run"), eval={"samples": 4})
    cfg.observability.tensorboard = False
    cfg.observability.progress = "quiet"
    recorder = RunRecorder(cfg, resume_step=None, started_at=time.time())
    recorder.evaluation(0, Evaluation({"math": 0.5}, {"math": 4}, {"math": 0}, {"math": {1: 0.25, 4: 0.75}},
                                      {"math": 0.3}))
    recorder.close()
    record = read_metrics(RunPaths.of(cfg.run_dir).metrics)[0]
    assert record["eval/math/score"] == 0.5 and record["eval/math/pass@1"] == 0.25
    assert record["eval/math/pass@4"] == 0.75 and record["eval/math/avg@4"] == 0.3
