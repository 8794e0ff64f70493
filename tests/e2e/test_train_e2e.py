"""Short real training runs through the CLI, each in its own embedded Ray (a subprocess, as a user runs it).

- RL (decoupled PPO, four mini-batches per batch, two fsdp2 trainer ranks) raises the validation score of a
  trivially learnable user environment (`module.path:Class`), and the clip acts.
- α = 0 with no barrier produces the same samples and losses as the batch-synchronous loop (α = 0,
  barrier=batch): the async pipeline degenerates exactly to sync.
- Injected env faults and redundancy lose and duplicate nothing; every socket that run listens on, Serve's
  included, is bound to loopback.
- What a user sees of every run is clean: no WARNING from rollart's own loggers, no Ray notice of a blocking
  `ray.get` inside an async actor, no Serve shutdown noise (`console_problems`).
- Every run directory holds only what the run-directory contract names (`rollart.base.run_dir.ARTEFACTS`, what
  the run-directory check inspects), and nothing there it would refuse (`unknown_run_dir_entries`).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from testutil import ListeningSockets, unknown_run_dir_entries

from rollart.base.untrusted import printable

pytestmark = [pytest.mark.slow]
USERENV = Path(__file__).parent / "userenv"


# what must never reach a user's console (stdout and stderr of `rollart train`, Ray's worker logs included)
CONSOLE_NOISE = [
    re.compile(r"\bWARNING\b.*\brollart[.:]"),  # a warning of rollart's own code (the CLI's log format)
    re.compile(r"blocking ray\.get inside async actor", re.IGNORECASE),  # a blocking call on an event loop
    re.compile(r"ServeController\.graceful_shutdown failed"),  # Serve shut down in the wrong order
]


def console_problems(text: str, expected: tuple[re.Pattern, ...] = ()) -> list[str]:
    """The console's lines a user must never see, less the `expected` ones (a test that injects a fault expects
    rollart to say so)."""
    return [line for line in text.splitlines()
            if any(p.search(line) for p in CONSOLE_NOISE) and not any(e.search(line) for e in expected)]


def rollart_train(run_dir: Path, *overrides: str, cwd: Path | None = None, timeout: int = 420,
                  sockets: ListeningSockets | None = None, expected: tuple[re.Pattern, ...] = ()) -> dict:
    """Run `rollart train` and check its console is clean (but for the `expected` warnings); with `sockets`,
    sample every listening socket of its process tree meanwhile."""
    cmd = [sys.executable, "-m", "rollart.cli", "train", f"run_dir={run_dir}", "observability.progress=plain",
           "observability.tensorboard=false", *overrides]
    with subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}) as proc:
        if sockets is not None:
            sockets.pid = proc.pid
        with sockets or contextlib.nullcontext():
            try:
                stdout, stderr = proc.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                raise
    assert proc.returncode == 0, f"rollart train failed ({proc.returncode}):\n{stdout[-3000:]}\n{stderr[-5000:]}"
    noise = console_problems(stdout + stderr, expected)
    assert not noise, "the console shows:\n" + "\n".join(noise)
    assert not unknown_run_dir_entries(run_dir), unknown_run_dir_entries(run_dir)
    return json.loads((run_dir / "summary.json").read_text())


def metrics_by_step(run_dir: Path) -> dict[int, dict]:
    out: dict[int, dict] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        rec = json.loads(line)
        out.setdefault(rec["step"], {}).update(rec)
    return out


PICK = ["domains.frozenlake=null", "domains.math=null", "domains.pick.env=pick_env:PickEnv",
        "domains.pick.pool=gen_decode", "domains.pick.max_turns=1", "domains.pick.max_new_tokens=8"]


def test_the_console_check_catches_each_kind_of_noise():
    lines = [
        "2026-11-30 18:07:29,287 WARNING rollart.resources: pool gen_decode is full, falling back to gen_prefill",
        "(InferenceWorker pid=123) Using blocking ray.get inside async actor. This blocks the event loop.",
        "(raylet) Task ServeController.graceful_shutdown failed. There are infinite retries remaining",
    ]
    assert console_problems("\n".join(lines)) == lines
    assert console_problems("2026-11-30 18:07:29,287 INFO rollart: run id 4bdd, attempt 0\nWARNING ray: x") == []


def test_a_short_run_with_ppo_mini_batches_raises_the_score_of_a_learnable_user_env(tmp_path):
    """Decoupled PPO with four optimizer steps per batch learns on two sharded trainer ranks (fsdp2, packed
    micro-batches), and its clip acts (one run checks all three)."""
    run = tmp_path / "run"
    summary = rollart_train(
        run, *PICK,
        "train.steps=12", "train.lr=1e-3", "train.aggregation=seq_mean", "train.warm_start.steps=20",
        "train.mini_batches=4", "rollout.batch_size=16", "eval.episodes_per_domain=32", "eval.temperature=1.0",
        "eval.every=100", "train.strategy=fsdp2", "train.workers=2", "pools.train.capacity=2",
        # α = 0, so the run is the same run each time: under α = 1 which version generated each rollout depends on
        # timing, and seed 1 gained +0.28 on 2026-12-03 but +0.09 in a slower make test on 2026-12-06 (a failure).
        # One seed, one that learns: at α = 0 seed 1 collapses to malformed answers (0.59 → 0.0), seed 2 gains
        # +0.44 (0.50 → 0.94, twice alike) — a learning check, not a stability one
        "rollout.alpha=0", "seed=2", cwd=USERENV,
    )
    assert summary["steps"] == 12
    assert summary["eval_last"] - summary["eval_first"] >= 0.25, summary
    m = metrics_by_step(run)
    assert all(m[s]["train/updates"] == 4 and m[s]["train/padding"] == 0 for s in range(12))
    assert [m[s]["train/version"] for s in (0, 11)] == [21.0, 32.0]  # 20 warm-start steps, then one per batch
    assert max(m[s]["train/clip_frac"] for s in range(12)) > 0, [m[s]["train/clip_frac"] for s in range(12)]
    assert all(m[s]["train/ratio_max"] > 1 and m[s]["train/approx_kl"] > 0 for s in range(12))
    # checkpoints are named by RL step: the 20 warm-start steps (versions 1–20) do not count
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step_00000010", "step_00000012"]
    # the rollouts as text: the worst, median and best of every step, as the model saw and wrote them
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert [(s["step"], s["rank"]) for s in samples[:3]] == [(0, "worst"), (0, "median"), (0, "best")]
    assert {s["step"] for s in samples} == set(range(12)) and all(s["domain"] == "pick" for s in samples)
    for s in samples:
        turn = s["turns"][0]
        assert "Pick a colour: answer \\boxed{red} or \\boxed{blue}." in turn["prompt"]
        assert "<|im_start|>" in turn["prompt"]  # the chat template, as the model saw it
        assert turn["response_tokens"] > 0 and turn["response"]
        assert s["reward"] in (0.0, 1.0, -0.1)  # red, blue, or malformed (domains.pick.format_penalty)
    last = [s for s in samples if s["step"] == 11]
    assert last[0]["reward"] <= last[1]["reward"] <= last[2]["reward"]
    shown = subprocess.run([sys.executable, "-m", "rollart.cli", "samples", str(run), "--worst"], capture_output=True,
                           text=True, check=True).stdout
    assert "step 11 · pick · worst" in shown and printable(last[0]["turns"][0]["response"]) in shown
    page = (run / "report" / "index.html").read_text()
    assert "<h2>Rollouts</h2>" in page and "<h3>step 11</h3>" in page and "step 11 · pick · best" in page


def test_alpha0_without_barrier_equals_the_synchronous_loop(tmp_path):
    # A domain where learning happens (nonzero advantages), else any two modes would trivially agree.
    # One request per engine step: batched float math depends on the batch-mates, which differ with timing,
    # and would move behaviour logprobs (and so the loss) in the last bits; sampled tokens would not change.
    common = [*PICK, "train.steps=3", "rollout.alpha=0", "rollout.batch_size=8", "train.warm_start.steps=20",
              "train.lr=1e-3", "eval.episodes_per_domain=2", "inference.max_batch_size=1", "seed=3"]
    rollart_train(tmp_path / "async", *common, "rollout.barrier=none", cwd=USERENV)
    rollart_train(tmp_path / "sync", *common, "rollout.barrier=batch", cwd=USERENV)
    a, s = metrics_by_step(tmp_path / "async"), metrics_by_step(tmp_path / "sync")
    assert all(a[step]["train/grad_norm"] > 0 for step in range(3)), "no learning: the comparison would be vacuous"
    keys = ["train/loss", "train/grad_norm", "train/tokens", "rollout/tokens", "reward/mean"]
    for step in range(3):
        for key in keys:
            assert a[step][key] == s[step][key], f"step {step} {key}: async {a[step][key]} != sync {s[step][key]}"
    assert a[0]["buffer/staleness_max"] == s[0]["buffer/staleness_max"] == 0


def test_injected_env_faults_and_redundancy_lose_and_duplicate_nothing(tmp_path):
    run = tmp_path / "faulty"
    sockets = ListeningSockets(0)
    rollart_train(
        run, "train.steps=3", "rollout.batch_size=8", "train.warm_start.steps=2", "eval.episodes_per_domain=2",
        "domains.frozenlake.max_turns=3", "rollout.redundancy.extra_per_group=1",
        "domains.frozenlake.inject.reset_fail_prob=0.2", "domains.frozenlake.inject.step_fail_prob=0.15",
        "domains.math.inject.step_fail_prob=0.2", "envs.reset_retries=1", "envs.retry_backoff_s=0.01",
        "observability.tensorboard=true",  # its event files too are in the run-directory listing
        "domains.math.reward.backend=serverless",  # (its replicas' gRPC servers are among the sockets checked)
        sockets=sockets,
        # an episode whose injected env fault outlasts its retries failed in the domain's own code: evaluation
        # says so (never scoring it 0) — the one warning this run may print
        expected=(re.compile(r"WARNING rollart: evaluation \w+: \d+ episodes? of domain (frozenlake|math) failed in the "
                             r"domain's own code"),),
    )
    # loopback means loopback: every socket the run listened on (Ray, its workers, Serve's proxy and the
    # reward replicas' gRPC servers included) was bound to 127.0.0.1 / ::1
    assert sockets.found and not sockets.public(), sockets.public()
    assert any("ServeReplica" in who for who in sockets.found.values()), "no reward replica was seen: vacuous"
    last = metrics_by_step(run)[2]
    assert last["buffer/ledger_violations"] == 0
    assert last["buffer/failed"] > 0 and last["rollout/replacements"] > 0  # faults happened and were replaced
    assert last["buffer/aborted"] > 0  # redundant stragglers were cancelled
    assert last["buffer/duplicates_refused"] == 0
    # a real run writes every metric namespace of the observability plane
    from rollart.observability import NAMESPACES

    written = {key.split("/")[0] for rec in metrics_by_step(run).values() for key in rec if "/" in key}
    assert set(NAMESPACES) <= written, f"namespaces never written: {set(NAMESPACES) - written}"


def test_two_sharded_ranks_send_every_rl_version_over_the_weight_group(tmp_path):
    """`weights.transport=collective` in a real run: two fsdp2 ranks on the machine the inference workers share
    (they start after the trainer, so the first versions go through the store); the group forms once they have
    started and carries every RL step's version, nothing falling back."""
    run = tmp_path / "run"
    summary = rollart_train(
        run, *PICK, "train.steps=4", "train.warm_start.steps=2", "rollout.batch_size=8", "eval.episodes_per_domain=4",
        "eval.every=100", "train.strategy=fsdp2", "train.workers=2", "pools.train.capacity=2",
        "weights.transport=collective", cwd=USERENV,
    )
    assert summary["steps"] == 4
    m = metrics_by_step(run)
    # wire_mb: the bytes the group carried (the store path reports none)
    assert all(m[s]["weights/wire_mb"] > 0 and "weights/collective_fallback" not in m[s] for s in range(4)), m[0]


def test_the_trainers_ranks_generate_between_train_steps(tmp_path):
    """`train.elastic_generation` in a real run: two fsdp2 ranks lend their devices after every train step (each
    gathers the weights into its own engine), the proxy routes turns of both domains there and moves them back
    before each step; nothing is lost or counted twice."""
    run = tmp_path / "run"
    summary = rollart_train(
        run, "train.steps=4", "train.warm_start.steps=2", "rollout.batch_size=8", "eval.episodes_per_domain=2",
        "eval.every=100", "train.strategy=fsdp2", "train.workers=2", "pools.train.capacity=2",
        "train.elastic_generation=true",
    )
    assert summary["steps"] == 4
    m = metrics_by_step(run)
    last = m[4]
    assert last["train/loans"] >= 4  # one at the start, one after each landed step (the last may still start)
    lent = sum(v for k, v in last.items() if k.startswith("rollout/routed/") and k.endswith("/trainer_lent"))
    assert lent > 0, {k: v for k, v in last.items() if k.startswith("rollout/routed/")}
    assert all("time/trainer.reclaim" in m[s] for s in range(4))
    assert last["buffer/ledger_violations"] == 0 and last["buffer/duplicates_refused"] == 0
