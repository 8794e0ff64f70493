"""Built-in `code` reward: the fraction of hidden tests the model's program passes, run in the sandbox.

In: a trajectory whose `reference` holds `tests` (a list of test snippets, e.g. `assert f(2) == 5`, or
one test program as a string) and optionally `entry_point` (for HumanEval-style `check(candidate)` tests)
and `language` (only "python"); the program is the last action's last fenced code block (```python ...```),
else its last `\\boxed{...}`, else the whole action (the same rule as the env plane's `extract_code`).
Out: `RewardOutput(passed / total, details={"passed", "total", "isolation", "timed_out", "error"})`.
A program with no code scores 0.0; tests that the sandbox killed (CPU, memory, wall time) count as failed.
A missing or empty `tests` is an error (the trajectory ends FAILED).

Each call runs `sandbox.run_sandboxed` in a worker thread, at most `SandboxConfig.max_concurrent` at once.
"""

from __future__ import annotations

import asyncio
import json
import re
import secrets
import threading
from pathlib import Path

from rollart.config import SandboxConfig
from rollart.reward.protocol import RewardOutput, boxed_contents, final_action
from rollart.reward.sandbox import probe_isolation, run_sandboxed, sandbox_python
from rollart.types import Trajectory

HARNESS = Path(__file__).with_name("code_harness.py")
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*\n(.*?)```", re.DOTALL)


def extract_program(text: str) -> str:
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1].strip("\n")
    boxed = boxed_contents(text)
    return boxed[-1].strip() if boxed else text.strip()


def count_passes(stdout: str, nonce: str, total: int) -> tuple[int, str]:
    """Passed tests from the harness's nonce-tagged lines, and the first failure's message."""
    passed: set[int] = set()
    first_error = ""
    for line in stdout.splitlines():
        if not line.startswith(nonce + " "):
            continue
        try:
            rec = json.loads(line[len(nonce) + 1 :])
        except json.JSONDecodeError:
            continue
        i = rec.get("i")
        if isinstance(i, int) and 0 <= i < total:
            if rec.get("ok") is True:
                passed.add(i)
            elif not first_error:
                first_error = str(rec.get("error", ""))
    return len(passed), first_error


class CodeReward:
    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self._slots = threading.BoundedSemaphore(cfg.max_concurrent)  # held in the worker thread

    def _run(self, program: str, tests: list[str], entry_point: str | None) -> RewardOutput:
        nonce = secrets.token_hex(16)
        files = {
            "main.py": HARNESS.read_text(),
            "solution.py": program,
            "tests.json": json.dumps({"tests": tests, "entry_point": entry_point}),
        }
        with self._slots:
            res = run_sandboxed(files, ["python", "main.py"], self.cfg, stdin=(nonce + "\n").encode())
        passed, error = count_passes(res.stdout, nonce, len(tests))
        if res.killed_by_limit and passed < len(tests):
            error = error or ("wall timeout" if res.timed_out else f"killed by signal {res.signal}")
        elif not error and passed < len(tests):
            error = res.stderr.strip()[-300:] or f"exit code {res.exit_code}"
        return RewardOutput(
            passed / len(tests),
            details={
                "passed": passed,
                "total": len(tests),
                "isolation": res.isolation,
                "timed_out": res.timed_out,
                "error": error,
            },
        )

    def warm(self) -> None:
        """Probe the sandbox's isolation and interpreter now (a few process starts, once per process)."""
        probe_isolation()
        sandbox_python(self.cfg.python)

    async def __call__(self, trajectory: Trajectory) -> RewardOutput:
        ref = trajectory.reference
        tests = ref.get("tests")
        if isinstance(tests, str):
            tests = [tests]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(
                f"code reward: trajectory {trajectory.trajectory_id} needs reference['tests'] as a non-empty "
                f"list of strings (or one string), got {type(tests).__name__}"
            )
        if ref.get("language", "python") != "python":
            raise ValueError(f"code reward: language {ref.get('language')!r} is not supported (only 'python')")
        program = extract_program(final_action(trajectory))
        if not program:
            return RewardOutput(0.0, details={"passed": 0, "total": len(tests), "error": "no code in the answer"})
        entry = ref.get("entry_point")
        return await asyncio.to_thread(self._run, program, tests, entry if isinstance(entry, str) else None)
