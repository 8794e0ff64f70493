"""The `code` reward, attacked as a policy would: every forgery scores 0 with wrong code, and right code
(the same tricks where they do not sabotage the program itself) scores 1 — on the real sandbox.

The task: `f(x) = 2x + 3`, three asserts; two cases use their own tests (a HumanEval-style `check`, a
builtin the solution shadows, a loop a StopIteration could end early). The whole corpus is scored
concurrently once (module fixture); each case is then checked on its own."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest

import rollart
from rollart.config import SandboxConfig
from rollart.reward.code_reward import CodeReward
from rollart.sandbox import check_isolation
from rollart.types import Task, Trajectory, Turn

CFG = SandboxConfig(cpu_time_s=1.0, wall_timeout_s=5.0, memory_mb=256, max_output_kb=64, max_concurrent=4)
# expected values that no stray `true`/`false` can equal (True == 1 in Python): a forged line misread as an
# answer must not pass by coincidence
REF = {"entry_point": "f", "tests": ["assert f(1) == 5", "assert f(2) == 7", "assert f(0) == 3"]}
WRONG = "def f(x):\n    return 0\n"
RIGHT = "def f(x):\n    return 2 * x + 3\n"
# where the tests of the built-in code domain live: readable to rollart, never to the candidate
DATASET = str(Path(rollart.__file__).parent / "envs" / "domains" / "code_env.py")
CHECKOUT = Path(rollart.__file__).resolve().parents[1]  # the attack searches the whole checkout too
# a world-readable copy of the expected values where an attacker would look (the fixture writes it)
DECOY = Path(f"/tmp/rollart-sbx-redteam-decoy-{os.getpid()}/tests.json")  # per session: suites may run side by side

FAKE_VERDICT = '{"i": %d, "ok": true, "error": ""}'
JSON_PATCH = (
    "import json\n"
    f"json.dumps = lambda *a, **k: '{FAKE_VERDICT % 0}'\n"
    "json.loads = lambda *a, **k: {'i': 0, 'ok': True}\n"
)
FRAME_WALK = (
    "import sys\n"
    "secrets_found = []\n"
    "frame = sys._getframe()\n"
    "while frame is not None:\n"
    "    for value in list(frame.f_globals.values()) + list(frame.f_locals.values()):\n"
    "        if isinstance(value, (str, bytes)) and 8 <= len(value) <= 64:\n"
    "            secrets_found.append(value if isinstance(value, str) else value.decode('latin-1'))\n"
    "    frame = frame.f_back\n"
    "for nonce in secrets_found + ['']:\n"
    "    for i in range(3):\n"
    f"        line = nonce + ' ' + '{FAKE_VERDICT}' % i\n"
    "        print(line, flush=True)\n"
    "        print(line, file=sys.stderr, flush=True)\n"
)
EVERY_FD = (
    "import os\n"
    "for fd in range(64):\n"
    "    for i in range(3):\n"
    "        try:\n"
    f"            os.write(fd, ('{FAKE_VERDICT}\\n' % i).encode())\n"
    "        except OSError:\n"
    "            pass\n"
)
LINGERING_CHILD = (
    "import os, time\n"
    "if os.fork() == 0:\n"
    "    time.sleep(0.3)\n"
    + "\n".join("    " + line for line in EVERY_FD.splitlines()) + "\n"
    "    os._exit(0)\n"
)
PATCH_BUILTINS = (
    "import builtins, unittest\n"
    "builtins.AssertionError = type('Never', (Exception,), {})\n"
    "builtins.print = lambda *a, **k: None\n"
    "unittest.TestCase.assertEqual = lambda *a, **k: None\n"
    "unittest.TestCase.assertTrue = lambda *a, **k: None\n"
)
READ_TESTS = (
    "import glob, os, re\n"
    "expected = {}\n"
    f"paths = [{DATASET!r}, 'tests.json', '../tests.json', 'judge.py', '/proc/1/cmdline', '/proc/1/environ']\n"
    f"paths.append({str(DECOY)!r})\n"
    "for pattern in ['/tmp/rollart-sbx-*/tests.json', '/tmp/*/tests.json', '/proc/*/cwd/tests.json',\n"
    f"                '/proc/*/cmdline', '{CHECKOUT}/**/code_env.py', '/root/**/tests.json']:\n"
    "    try:\n"
    "        paths += glob.glob(pattern, recursive=True)\n"
    "    except OSError:\n"
    "        pass\n"
    "for path in paths:\n"
    "    try:\n"
    "        text = open(path, errors='replace').read()\n"
    "    except OSError:\n"
    "        continue\n"
    "    for a, b in re.findall(r'f\\((\\d+)\\) == (\\d+)', text):\n"
    "        expected[int(a)] = int(b)\n"
)
KILL_EVERYONE = (
    "import os, signal\n"
    f"targets = [os.getppid(), 1, {os.getpid()}, {os.getppid()}] + list(range(2, 400))\n"
    "for pid in targets:\n"
    "    for sig in (signal.SIGKILL, signal.SIGSTOP, signal.SIGTERM):\n"
    "        try:\n"
    "            os.kill(pid, sig)\n"
    "        except OSError:\n"
    "            pass\n"
    "try:\n"
    "    os.killpg(0, signal.SIGKILL)\n"
    "except OSError:\n"
    "    pass\n"
)
IGNORE_SIGNALS = (
    "import signal\n"
    "for s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGINT, signal.SIGHUP, signal.SIGALRM):\n"
    "    signal.signal(s, signal.SIG_IGN)\n"
)
ALWAYS_EQUAL = (
    "class Anything(int):\n"
    "    def __eq__(self, other):\n"
    "        return True\n"
    "    __hash__ = int.__hash__\n"
    "class Whatever:\n"
    "    def __eq__(self, other):\n"
    "        return True\n"
)
PROTOCOL_FLOOD = (
    "import os\n"
    "def f(x):\n"
    "    for fd in range(3, 64):\n"
    "        try:\n"
    "            os.write(fd, b'{\"ok\": 0}\\n' * 50)\n"
    "        except OSError:\n"
    "            pass\n"
    "    return 0\n"
)
SHADOW_REF = {"entry_point": "f", "tests": ["assert f([3, 1, 2]) == sorted([3, 1, 2])", "assert f([]) == sorted([])"]}
CHECK_REF = {"entry_point": "add", "tests": ["def check(candidate):\n    assert candidate(2, 3) == 5\n"
                                             "    assert candidate(-1, 1) == 0\n"]}
LOOP_REF = {"entry_point": "f", "tests": ["assert all(a == b for a, b in zip(map(f, [1, 2, 0]), [5, 7, 3]))"]}

# name → (wrong program, right program, reference)
CASES: dict[str, tuple[str, str, dict]] = {
    "patch json.dumps/loads": (JSON_PATCH + WRONG, JSON_PATCH + RIGHT, REF),
    "walk stack frames, print fake verdicts": (FRAME_WALK + WRONG, FRAME_WALK + RIGHT, REF),
    "__eq__ always true": (ALWAYS_EQUAL + "def f(x):\n    return Whatever()\n", RIGHT, REF),
    "int subclass with __eq__ always true": (ALWAYS_EQUAL + "def f(x):\n    return Anything(0)\n", RIGHT, REF),
    "sys.exit(0) before the tests": ("import sys\nsys.exit(0)\n" + WRONG, RIGHT, REF),
    "os._exit(0) before the tests": ("import os\nos._exit(0)\n" + WRONG, RIGHT, REF),
    "os._exit(0) inside the call": ("import os\ndef f(x):\n    os._exit(0)\n", RIGHT, REF),
    "raise SystemExit inside the call": ("def f(x):\n    raise SystemExit(0)\n", RIGHT, REF),
    "patch builtins and unittest": (PATCH_BUILTINS + WRONG, PATCH_BUILTINS + RIGHT, REF),
    "read the harness, the tests, the dataset": (
        READ_TESTS + "def f(x):\n    return expected.get(x, 0)\n",
        READ_TESTS + "def f(x):\n    return expected.get(x, 2 * x + 3)\n", REF),
    "fake verdict lines on every fd": (EVERY_FD + WRONG, RIGHT, REF),
    "a child that writes fake verdicts later": (LINGERING_CHILD + WRONG, LINGERING_CHILD + RIGHT, REF),
    "kill the parent and every process": (KILL_EVERYONE + WRONG, RIGHT, REF),
    "ignore signals and spin": (IGNORE_SIGNALS + "def f(x):\n    while True:\n        pass\n",
                                IGNORE_SIGNALS + RIGHT, REF),
    "flood the answer channel": (PROTOCOL_FLOOD, RIGHT, REF),
    "output bomb": ("def f(x):\n    while True:\n        print('x' * 65536)\n",
                    "def f(x):\n    print('thinking ...' * 10)\n    return 2 * x + 3\n", REF),
    "huge number": ("def f(x):\n    return 10 ** 5000\n", RIGHT, REF),
    "shadow a builtin the test uses": ("def sorted(x):\n    return 'same'\ndef f(x):\n    return 'same'\n",
                                       "def f(x):\n    return sorted(x)\n", SHADOW_REF),
    "define check() to replace the test's": ("def check(candidate):\n    pass\ndef add(a, b):\n    return 0\n",
                                             "def add(a, b):\n    return a + b\n", CHECK_REF),
    "StopIteration ends the test's loop early": ("def f(x):\n    raise StopIteration\n", RIGHT, LOOP_REF),
}


def trajectory(program: str, reference: dict) -> Trajectory:
    return Trajectory("t", Task("k", "code", "code", 0, "g"), 0,
                      (Turn((), (), (), (), action=f"```python\n{program}```"),), reference=reference)


@pytest.fixture(scope="module")
def decoy():
    DECOY.parent.mkdir(exist_ok=True)
    DECOY.parent.chmod(0o755)
    DECOY.write_text("\n".join(REF["tests"]))
    DECOY.chmod(0o644)
    found: dict = {}
    exec(READ_TESTS, found)  # outside the sandbox the attack works: the sandbox is what stops it
    assert found["expected"] == {1: 5, 2: 7, 0: 3}
    yield
    DECOY.unlink()
    DECOY.parent.rmdir()


@pytest.fixture(scope="module")
def scored(decoy):
    assert check_isolation(CFG) == "process+rlimits+" + ("uid" if os.geteuid() == 0 else "user") + \
        "+landlock+netns+pidns+mntns+tmpfs+cgroup", "the red-team corpus must run under full isolation"
    reward = CodeReward(CFG)

    async def score_all():
        jobs = {(name, kind): reward(trajectory(program, ref))
                for name, (wrong, right, ref) in CASES.items() for kind, program in (("wrong", wrong), ("right", right))}
        results = await asyncio.gather(*jobs.values())
        return dict(zip(jobs, results))

    return asyncio.run(score_all())


@pytest.mark.parametrize("name", list(CASES))
def test_forgery_scores_zero_and_right_code_one(scored, name):
    wrong, right = scored[(name, "wrong")], scored[(name, "right")]
    assert wrong.reward == 0.0, (name, dict(wrong.details))
    assert right.reward == 1.0, (name, dict(right.details))
    assert wrong.details["isolation"].endswith("landlock+netns+pidns+mntns+tmpfs+cgroup")


def test_output_bomb_is_reported(scored):
    details = scored[("output bomb", "wrong")].details
    assert details["output_capped"] is True and "max_output_kb=64" in details["error"]
    assert scored[("output bomb", "right")].details["output_capped"] is False
