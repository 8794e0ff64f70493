"""A short real training job on the shared test Ray with the LLM proxy split in two (`inference.proxy_shards=2`):
env workers send each trajectory's turns to its group's shard, the driver suspends, updates and resumes both
at every weight sync. The run finishes, turns reached both shards (their counts add up to what the proxies
routed), and the ledger is exact: every trajectory started ended once, none trained twice."""

from __future__ import annotations

import pytest
from testutil import free_port

from rollart.config.loader import load_config
from rollart.job.driver import train
from rollart.observability import read_metrics
from rollart.observability.ledger import audit_ledger

pytestmark = [pytest.mark.slow, pytest.mark.ray]
STEPS = 2
BATCH = 8


def test_a_job_with_two_proxy_shards_routes_through_both_and_keeps_the_ledger_exact(ray_local, tiny_model_path,
                                                                                      tmp_path):
    run_dir = tmp_path / "run"
    # groups of 2: four groups a batch, so the groups of two steps (g000000…) fall on both shards
    cfg = load_config(None, [
        f"run_dir={run_dir}", f"model.path={tiny_model_path}", f"train.steps={STEPS}", "train.warm_start.steps=0",
        f"rollout.batch_size={BATCH}", "rollout.group_size=2", "domains.frozenlake.max_turns=2",
        "eval.episodes_per_domain=2", "eval.every=100", "observability.progress=quiet",
        "observability.tensorboard=false", f"reward.serverless.port={free_port()}", "inference.proxy_shards=2",
    ])
    summary = train(cfg)
    assert summary["steps"] == STEPS

    last: dict[str, float] = {}
    for record in read_metrics(run_dir / "metrics.jsonl"):
        last.update(record)
    shards = [last["rollout/routed_by_shard/0"], last["rollout/routed_by_shard/1"]]
    routed = sum(v for k, v in last.items() if k.startswith("rollout/routed/"))
    assert min(shards) > 0 and sum(shards) == routed, (shards, routed)

    audit = audit_ledger(run_dir / "ledger.jsonl")
    assert audit.lost == () and audit.broken == (), (audit.lost, audit.broken)
    assert audit.fates["trained"] == STEPS * BATCH and last["buffer/ledger_violations"] == 0
