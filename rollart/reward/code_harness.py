"""Test harness of the `code` reward: copied into the sandbox as main.py and run there (stdlib only).

In (files in its working dir): `solution.py` (the candidate program), `tests.json` ({"tests": [str, ...],
"entry_point": str | null}); on stdin, one line: a nonce chosen by the parent.
Out: for each test, one line `<nonce> {"i": index, "ok": bool, "error": str}` written to a private copy of
stdout, as soon as the test ends — so a test that hangs or blows a limit still leaves the earlier results.
The parent counts only lines with its nonce, so a candidate that prints, exits early or kills the process
cannot report a pass it did not earn (code in the same interpreter could still read the nonce from the
harness's frames; the sandbox limits, not this file, are the security boundary).

Each test runs in a fresh copy of the candidate's namespace. A HumanEval-style test that defines
`check(candidate)` is called with the `entry_point` function.
"""

import json
import os
import sys


def main() -> None:
    nonce = sys.stdin.readline().strip()
    out = os.dup(1)  # the candidate may close or replace sys.stdout; this fd stays ours

    def report(i: int, ok: bool, error: str = "") -> None:
        os.write(out, (nonce + " " + json.dumps({"i": i, "ok": ok, "error": error[-300:]}) + "\n").encode())

    with open("tests.json") as f:
        spec = json.load(f)
    tests, entry_point = spec["tests"], spec.get("entry_point")
    with open("solution.py") as f:
        source = f.read()
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 — any failure of the candidate fails every test
        for i in range(len(tests)):
            report(i, False, f"solution failed to load: {type(exc).__name__}: {exc}")
        return
    for i, test in enumerate(tests):
        scope = dict(namespace)
        try:
            exec(compile(test, f"test_{i}.py", "exec"), scope)
            if entry_point and callable(scope.get("check")) and "check" not in namespace:
                scope["check"](scope[entry_point])
            report(i, True)
        except BaseException as exc:  # noqa: BLE001 — SystemExit, KeyboardInterrupt … count as failures
            report(i, False, f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
