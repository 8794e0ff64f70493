"""The RL loop's collaborators implement its protocols, member by member: the real `System` and the twin's
`SimSystem` are `LoopSystem`s, `RunRecorder` and the twin's `SimRecorder` are `LoopRecorder`s, the
`RolloutScheduler` is the `Rollout` — each method with the protocol's name, parameters and async-ness, each
attribute present on a built instance. The twin reaches the loop through these alone: it imports no private
name of another module, and no member it implements for the loop is a body that does nothing."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rollart.config.loader import load_config
from rollart.control import RolloutScheduler, SampleBuffer, StalenessPolicy
from rollart.loop import LoopRecorder, LoopSystem, Rollout, TrainedVersion
from rollart.job.recorder import RunRecorder
from rollart.sim import presets
from rollart.sim.run import SimRecorder
from rollart.sim.system import SimSystem
from rollart.job.system import System

SIM = Path(__file__).resolve().parents[2] / "rollart" / "sim"


def members(protocol: type) -> tuple[dict[str, Any], set[str]]:
    """The protocol's methods (by name) and attributes."""
    methods = {name: fn for name, fn in vars(protocol).items() if inspect.isfunction(fn) and not name.startswith("_")}
    attributes = set(getattr(protocol, "__annotations__", {}))
    return methods, attributes


def conformance_problems(protocol: type, implementation: Any) -> list[str]:
    cls = type(implementation)
    methods, attributes = members(protocol)
    problems = []
    for name, spec in methods.items():
        impl = getattr(cls, name, None)
        if not inspect.isfunction(impl):
            problems.append(f"{cls.__name__}.{name}: missing")
            continue
        if inspect.iscoroutinefunction(spec) != inspect.iscoroutinefunction(impl):
            problems.append(f"{cls.__name__}.{name}: {'not ' if inspect.iscoroutinefunction(spec) else ''}async")
        want = list(inspect.signature(spec).parameters)
        got = list(inspect.signature(impl).parameters)[:len(want)]
        if got != want:
            problems.append(f"{cls.__name__}.{name}{tuple(got)}: the protocol's parameters are {tuple(want)}")
    problems += [f"{cls.__name__}.{name}: no such attribute" for name in sorted(attributes)
                 if not hasattr(implementation, name)]
    return problems


@pytest.fixture(scope="module")
def twin() -> SimSystem:
    cfg = presets.run_config(presets.mapped({"frozenlake": "h800", "math": "h20"}), batch=16, steps=1)
    return SimSystem(cfg, presets.hardware({"h800": ("H800", 2, 1), "h20": ("H20", 2, 1)}, train=("H800", 2)))


def test_both_systems_are_loop_systems(twin: SimSystem) -> None:
    cfg = load_config(None, [])
    real = System(cfg, None, None, None, SimpleNamespace(version=0), {}, None, None, None, None)  # type: ignore[arg-type]
    for system in (real, twin):
        assert conformance_problems(LoopSystem, system) == []
        assert conformance_problems(TrainedVersion, system.trainer) == []


def test_both_recorders_are_loop_recorders(tmp_path: Path, twin: SimSystem) -> None:
    real = RunRecorder(load_config(None, [f"run_dir={tmp_path}", "observability.progress=quiet"]), resume_step=None)
    try:
        for recorder in (real, SimRecorder(twin.cfg, clock=lambda: 0.0)):
            assert conformance_problems(LoopRecorder, recorder) == []
    finally:
        real.close()


def test_the_scheduler_is_the_rollout() -> None:
    cfg = load_config(None, [])
    policy = StalenessPolicy(1)
    scheduler = RolloutScheduler(cfg.rollout, cfg.domains, None, None, SampleBuffer(policy), policy,  # type: ignore[arg-type]
                                 total_batches=1)
    assert conformance_problems(Rollout, scheduler) == []


def test_the_check_catches_a_missing_member_a_wrong_signature_and_a_wrong_async() -> None:
    class Drifted:
        def rl_starts(self) -> None: ...
        def phase(self, timed) -> None: ...  # noqa: ANN001 — another name than the protocol's
        async def step(self, step, batch, version, metrics) -> None: ...  # noqa: ANN001

    problems = conformance_problems(LoopRecorder, Drifted())
    assert "Drifted.train_step_done: missing" in problems and "Drifted.evaluation: missing" in problems
    assert any(p.startswith("Drifted.phase('self', 'timed')") for p in problems)
    assert "Drifted.step: async" in problems


# Run in a fresh interpreter: CPython 3.11's `ast.parse` can fail with "AST constructor recursion depth
# mismatch" once an earlier test in the same process has hit its recursion limit while parsing.
_SCAN = """
import ast, json, sys
from pathlib import Path
members = set(json.loads(sys.argv[2]))
private, idle = [], []
for path in sorted(Path(sys.argv[1]).glob("*.py")):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.module.startswith("rollart.sim"):
            private += [f"{path.name}: {node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
        if isinstance(node, ast.ClassDef) and node.name in ("SimSystem", "SimRecorder"):
            for fn in node.body:
                if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in members:
                    body = [s for s in fn.body if not (isinstance(s, ast.Expr) and isinstance(s.value, ast.Constant))]
                    if all(isinstance(s, ast.Pass) for s in body):
                        idle.append(f"{node.name}.{fn.name}")
print(json.dumps([private, idle]))
"""


def test_the_twin_imports_no_private_name_and_implements_no_member_that_does_nothing() -> None:
    loop_members = sorted({name for protocol in (LoopSystem, LoopRecorder) for name in members(protocol)[0]})
    done = subprocess.run([sys.executable, "-c", _SCAN, str(SIM), json.dumps(loop_members)], capture_output=True,
                          text=True, timeout=60, check=True)
    private, idle = json.loads(done.stdout)
    assert private == [] and idle == []
