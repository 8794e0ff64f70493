"""Records written as JSON read back equal (floats bit for bit), and a bad file names what is wrong."""

import json

import pytest

from rollart.base.codec import from_json, to_json
from rollart.types import Span, Status, Task, Trajectory, Turn


def trajectory() -> Trajectory:
    turn = Turn((1, 2, 3), (7, 8), (-0.1234567890123, -2.5e-08), (3, 4), observation="obs", action="a",
                reward=0.5, finish_reason="length", spans=(Span("generate", 1.5, 2.25, "inference/gen/0"),))
    return Trajectory("g000001/2", Task("g000001/2", "math", "math", 17, "g000001"), 3, (turn, turn),
                      Status.COMPLETED, "env terminated", reward=0.75, env_return=1.0,
                      reference={"answer": "4", "tests": ["x", 1]}, metrics={"turns": 2.0},
                      spans=(Span("reward", 3.0, 3.5, "reward/reward/local"),))


def test_a_trajectory_round_trips_through_json_exactly():
    t = trajectory()
    back = from_json(Trajectory, json.loads(json.dumps(to_json(t))))
    assert back == t
    assert back.turns[0].logprobs == (-0.1234567890123, -2.5e-08) and back.status is Status.COMPLETED
    assert isinstance(back.turns, tuple) and isinstance(back.turns[0].spans[0], Span)


def test_a_bad_record_names_the_field():
    data = to_json(trajectory())
    data["turns"][1]["tokens"] = [1]
    with pytest.raises(ValueError, match=r"Trajectory.turns\[1\]: Turn has no field\(s\) \['tokens'\]"):
        from_json(Trajectory, data)
    data = to_json(trajectory())
    data["start_version"] = "three"
    with pytest.raises(TypeError, match="Trajectory.start_version: expected int"):
        from_json(Trajectory, data)
