"""Online re-mapping in a real run: `rollart train` with `rollout.remap=auto` on two CPU generation pools.

`drifts` (on gen_decode) starts decode-like — one turn, a short prompt — and from its third batch of groups
on turns prefill-like: four turns with a long board each, the shape of `steady` (on gen_prefill) from the
start. The run measures each domain's profile from its trained trajectories (no profile is declared: the
first episodes are the baseline), sees `drifts` drift past `rollout.remap_drift`, confirms it on fresh
episodes, and at the next weight sync routes `drifts`' new trajectories to gen_prefill, the pool of the
workload it now resembles. The test checks that the re-route happened (the timeline's mark, the routing
counters: no `drifts` request on gen_prefill before it, some after it) and that nothing was lost or
trained twice (the ledger file's audit, the scheduler's own ledger check)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_train_e2e import USERENV, metrics_by_step, rollart_train

from rollart.observability.ledger import audit_ledger

pytestmark = [pytest.mark.slow]

STEPS = 7
DOMAINS = ["domains.frozenlake=null", "domains.math=null"] + [
    f"domains.{name}.{key}={value}"
    for name, pool, shift_at in (("drifts", "gen_decode", 8), ("steady", "gen_prefill", 0))
    for key, value in (("env", "shift_env:ShiftEnv"), ("pool", pool), ("options.shift_at", shift_at),
                       ("max_turns", 4), ("max_new_tokens", 4))
]


def test_a_domain_whose_workload_drifts_is_rerouted_at_a_weight_sync_and_nothing_is_lost(tmp_path: Path) -> None:
    run = tmp_path / "run"
    summary = rollart_train(
        run, *DOMAINS, f"train.steps={STEPS}", "train.warm_start.steps=0", "rollout.batch_size=16",
        "rollout.group_size=4", "rollout.redundancy.selection=stratified", "rollout.remap=auto",
        "rollout.remap_drift=0.5", "rollout.remap_min_episodes=8", "eval.episodes_per_domain=2",
        "eval.every=1000", "train.checkpoint_every=1000", cwd=USERENV,
    )
    assert summary["steps"] == STEPS
    steps = metrics_by_step(run)
    # the workload shifted and was measured: `drifts` went from one turn to four
    assert steps[0]["profile/drifts/turns"] == 1.0 and steps[STEPS - 1]["profile/drifts/turns"] == 4.0
    # the re-mapping happened once, at a weight sync, moving `drifts` to the pool of `steady`
    remapped_at = next(s for s in range(STEPS) if steps[s]["rollout/remaps"] > 0)
    assert steps[STEPS - 1]["rollout/remaps"] == 1.0
    marks = [e for e in json.loads((run / "timeline.json").read_text())["traceEvents"]
             if e.get("ph") == "i" and e.get("name") == "remap"]
    assert len(marks) == 1 and "drifts → gen_prefill" in marks[0]["args"]["detail"], marks
    # before it, no `drifts` request generated on gen_prefill; after it, its new trajectories did
    on_new_pool = [steps[s].get("rollout/routed/drifts/gen_prefill", 0.0) for s in range(STEPS)]
    assert on_new_pool[remapped_at - 1] == 0.0 and on_new_pool[STEPS - 1] > 0, on_new_pool
    assert steps[STEPS - 1].get("rollout/routed/steady/gen_decode", 0.0) == 0.0  # `steady` never moved
    # nothing lost, nothing trained twice
    audit = audit_ledger(run / "ledger.jsonl")
    assert audit.started > 0 and audit.lost == () and audit.broken == (), audit
    assert len(audit.trained) == STEPS * 16
    assert steps[STEPS - 1]["buffer/ledger_violations"] == 0 and steps[STEPS - 1]["buffer/duplicates_refused"] == 0
