"""Built-in `code` reward: the fraction of hidden tests the model's program passes, scored so it cannot be forged.

In: a trajectory whose `reference` holds `tests` (a list of test snippets, e.g. `assert f(2) == 5`, or
one test program as a string) and optionally `entry_point` (for HumanEval-style `check(candidate)` tests)
and `language` (only "python"); the program is the last action's last fenced code block (```python ...```),
else its last `\\boxed{...}`, else the whole action (the same rule as the env plane's `extract_code`).
Out: `RewardOutput(passed / total, details={"passed", "total", "isolation", "timed_out", "output_capped",
"limit_hit", "error"})`. A program with no code, or one that is not valid text (a lone surrogate cannot be
written to a file), scores 0.0 with the reason; tests that the sandbox killed or starved (CPU, memory,
processes or disk of the whole program tree, wall time, output cap) count as failed. A missing or empty
`tests` is a `RewardInputError` (the request's fault).

Scoring never happens where the candidate runs (`sandbox.run_pair`): the candidate program runs in one
sandbox (code_candidate.py) holding no tests, no expected values and no verdicts; the tests run in a
second sandbox (code_judge.py), calling the candidate's functions with plain data over a pipe and getting
plain data back, which they decode themselves. This process reads the verdicts from the judge's stdout
only — lines it parses itself; nothing the candidate prints or returns can write there.

Each call runs in a worker thread, at most `SandboxConfig.max_concurrent` at once. If the sandbox cannot
give `reward.sandbox.min_isolation`, scoring raises `SandboxUnavailable` and nothing runs.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

from rollart.base.untrusted import loads_json
from rollart.config import SandboxConfig
from rollart.reward.protocol import RewardInputError, RewardOutput, boxed_contents, final_action
from rollart.sandbox import Program, check_isolation, encode_text, run_pair
from rollart.types import Trajectory

_HERE = Path(__file__).parent
JUDGE, CANDIDATE, WIRE = (_HERE / n for n in ("code_judge.py", "code_candidate.py", "code_wire.py"))
_FENCE = re.compile(r"```[A-Za-z0-9_+-]*\n(.*?)```", re.DOTALL)


def extract_program(text: str) -> str:
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1].strip("\n")
    boxed = boxed_contents(text)
    return boxed[-1].strip() if boxed else text.strip()


def count_passes(verdicts: str, total: int) -> tuple[int, str]:
    """Passed tests from the judge's verdict lines, and the first failure's message. Lines that are not a
    well-formed verdict for a test index in range are ignored; a test passes only on `"ok": true`."""
    passed: set[int] = set()
    first_error = ""
    for line in verdicts.splitlines():
        if not line.startswith("{"):
            continue  # not a verdict: skipped before any parsing
        try:
            rec = loads_json(line)
        except ValueError:  # not JSON or nested past loads_json's depth: not a verdict
            continue
        i = rec.get("i") if isinstance(rec, dict) else None
        if type(i) is int and 0 <= i < total:
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
        wire = WIRE.read_text()
        spec = {"tests": tests, "entry_point": entry_point, "max_message_bytes": self.cfg.max_output_kb * 1024}
        judge = Program({"judge.py": JUDGE.read_text(), "wire.py": wire, "solution.py": program,
                         "tests.json": json.dumps(spec)}, ["python", "judge.py"])
        candidate = Program({"candidate.py": CANDIDATE.read_text(), "wire.py": wire, "solution.py": program},
                            ["python", "candidate.py"])
        with self._slots:
            res, cand = run_pair(judge, candidate, self.cfg)
        passed, error = count_passes(res.stdout, len(tests))
        limit = res.limit_hit or cand.limit_hit
        if passed < len(tests):
            if limit:
                error = f"the program reached the sandbox's {limit} limit" + (f" ({error})" if error else "")
            elif res.output_capped:
                error = f"output over reward.sandbox.max_output_kb={self.cfg.max_output_kb}: the sandbox was stopped"
            elif res.timed_out:
                error = error or f"wall timeout ({self.cfg.wall_timeout_s:g}s)"
            elif not error:
                error = (res.stderr.strip() or cand.stderr.strip())[-300:] or f"judge exit code {res.exit_code}"
        return RewardOutput(
            passed / len(tests),
            details={
                "passed": passed,
                "total": len(tests),
                "isolation": res.isolation,
                "timed_out": res.timed_out,
                "output_capped": res.output_capped,
                "limit_hit": limit,
                "error": error,
            },
        )

    def warm(self) -> None:
        """Probe the sandbox now (a few process starts, once per process); `SandboxUnavailable` if it cannot
        give `min_isolation`."""
        check_isolation(self.cfg)

    async def __call__(self, trajectory: Trajectory) -> RewardOutput:
        ref = trajectory.reference
        tests = ref.get("tests")
        if isinstance(tests, str):
            tests = [tests]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise RewardInputError(
                f"code reward: trajectory {trajectory.trajectory_id} needs reference['tests'] as a non-empty "
                f"list of strings (or one string), got {type(tests).__name__}"
            )
        if ref.get("language", "python") != "python":
            raise RewardInputError(f"code reward: language {ref.get('language')!r} is not supported (only 'python')")
        program = extract_program(final_action(trajectory))
        if not program:
            return RewardOutput(0.0, details={"passed": 0, "total": len(tests), "error": "no code in the answer"})
        try:
            encode_text("the program", program)
        except ValueError as exc:  # the request is fine; the policy wrote something no file can hold
            return RewardOutput(0.0, details={"passed": 0, "total": len(tests), "error": str(exc)})
        entry = ref.get("entry_point")
        return await asyncio.to_thread(self._run, program, tests, entry if isinstance(entry, str) else None)
