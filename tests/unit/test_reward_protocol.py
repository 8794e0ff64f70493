"""Reward protocol: payload round trip and validation, output normalisation, sync/async/class reward fns."""

from __future__ import annotations

import asyncio
import json

import pytest

from rollart.reward.protocol import (
    PayloadError,
    RewardOutput,
    boxed_contents,
    call_reward,
    final_action,
    normalise,
    to_payload,
    trajectory_from_payload,
)
from rollart.reward.registry import RewardFns, check_spec, import_reward
from rollart.config import RunConfig
from rollart.types import Status, Task, Trajectory, Turn


def make_traj(actions=("\\boxed{42}",), reference=None, domain="math", tid="t0") -> Trajectory:
    turns = tuple(
        Turn((1, 2), (3, 4), (-0.1, -0.2), (0, 0), observation=f"obs{i}", action=a, reward=0.5 * i,
             format_ok=i % 2 == 0)
        for i, a in enumerate(actions)
    )
    return Trajectory(tid, Task("task", domain, domain, 7, "g1", "val"), 3, turns, status=Status.COMPLETED,
                      env_return=1.5, reference=reference or {"answer": "42"})


def test_payload_round_trip_keeps_text_and_drops_tokens():
    traj = make_traj(("first", "\\boxed{42}"))
    payload = json.loads(json.dumps(to_payload(traj, "math")))
    assert payload["fn"] == "math" and "prompt_token_ids" not in json.dumps(payload)
    back = trajectory_from_payload(payload)
    assert back.trajectory_id == "t0" and back.domain == "math" and back.task.split == "val"
    assert [t.action for t in back.turns] == ["first", "\\boxed{42}"]
    assert [t.format_ok for t in back.turns] == [True, False]
    assert back.turns[1].reward == 0.5 and back.env_return == 1.5 and back.start_version == 3
    assert back.status is Status.COMPLETED and dict(back.reference) == {"answer": "42"}
    assert back.turns[0].response_token_ids == () and final_action(back) == "\\boxed{42}"


@pytest.mark.parametrize(
    "mutate, field",
    [
        (lambda p: p.pop("trajectory_id"), "trajectory_id"),
        (lambda p: p.update(v=2), "v"),
        (lambda p: p.update(turns="x"), "turns"),
        (lambda p: p["turns"][0].update(action=3), "turns[0].action"),
        (lambda p: p.update(status="bogus"), "status"),
        (lambda p: p.update(reference=[1]), "reference"),
        (lambda p: p["task"].update(split="test"), "task.split"),
    ],
)
def test_bad_payload_names_the_field(mutate, field):
    payload = to_payload(make_traj(), "math")
    mutate(payload)
    with pytest.raises(PayloadError, match=field.replace("[", r"\[").replace("]", r"\]")):
        trajectory_from_payload(payload)


def test_boxed_contents_balances_braces():
    assert boxed_contents("a \\boxed{\\frac{1}{2}} b \\boxed{3}") == ["\\frac{1}{2}", "3"]
    assert boxed_contents("\\boxed{unclosed") == []


def test_normalise_checks_value_and_turn_count():
    traj = make_traj(("a", "b"))
    assert normalise(True, traj, "f").reward == 1.0
    assert normalise(RewardOutput(0.5, per_turn=(1, 0)), traj, "f").per_turn == (1.0, 0.0)
    with pytest.raises(ValueError, match="per-turn"):
        normalise(RewardOutput(0.5, per_turn=(1.0,)), traj, "f")
    with pytest.raises(ValueError, match="non-finite"):
        normalise(float("nan"), traj, "f")
    with pytest.raises(TypeError, match="returned str"):
        normalise("1", traj, "f")


class CountingReward:
    """A class reward: instantiated once, called per trajectory."""

    def __init__(self):
        self.calls = 0

    def __call__(self, trajectory):
        self.calls += 1
        return len(trajectory.turns)


async def async_reward(trajectory):
    await asyncio.sleep(0)
    return RewardOutput(2.0, details={"k": "v"})


def sync_reward(trajectory):
    return 1.0


def test_call_reward_runs_sync_async_and_class_fns():
    traj = make_traj(("a", "b", "c"))
    assert asyncio.run(call_reward(sync_reward, traj)).reward == 1.0
    out = asyncio.run(call_reward(async_reward, traj))
    assert out.reward == 2.0 and out.details == {"k": "v"}
    fn = import_reward(f"{__name__}:CountingReward")
    assert asyncio.run(call_reward(fn, traj)).reward == 3.0 and fn.calls == 1


def test_registry_resolves_builtins_and_rejects_unknown_specs():
    fns = RewardFns(RunConfig())
    assert asyncio.run(call_reward(fns.get("env"), make_traj())).reward == 1.5
    assert fns.get("format") is fns.get("format")  # made once
    with pytest.raises(ValueError, match="not a built-in"):
        check_spec("maths", "domains.math.reward.fn")
    with pytest.raises(ValueError, match="cannot be loaded"):
        import_reward("no_such_module_xyz:fn")
    with pytest.raises(ValueError, match="not a callable"):
        import_reward("rollart.reward.protocol:PAYLOAD_VERSION")
