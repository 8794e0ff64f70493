"""The program that runs a repair task's hidden cases inside the scoring sandbox (copied there as text).

In (stdin, one JSON line): `[[module, function, args_repr], ...]` — inputs only; the expected results never
leave the host. Out (stdout, the last line): `MARK` + a JSON list with, per case, the repr of the result
or `!ExceptionName` (each cut at `MAX_VALUE_CHARS`). The host's judge (`scoring.judge`) compares them.

Run as `python3 -I _rollart_hidden.py` in the package's root: `-I` keeps the environment, the user site and
the working directory's `sitecustomize.py` out, and the root is put on `sys.path` only now, after the
interpreter started. Whatever the candidate package does when imported or called (print, exit, patch
builtins), it can only change its own results: the verdicts are computed outside this process.
Standard library only; no import of rollart.
"""

import ast
import importlib
import json
import sys

MARK = "@@rollart-hidden-results@@"
MAX_VALUE_CHARS = 2000


def run_cases(cases):
    results = []
    for module, function, args in cases:
        try:
            value = repr(getattr(importlib.import_module(module), function)(*ast.literal_eval(args)))
        except BaseException as exc:  # noqa: BLE001 - the candidate may raise anything, SystemExit too
            value = "!" + type(exc).__name__
        results.append(str(value)[:MAX_VALUE_CHARS])
    return results


def main():
    cases = json.loads(sys.stdin.readline())
    sys.path.insert(0, ".")
    results = run_cases(cases)
    sys.stdout.flush()
    sys.__stdout__.write("\n" + MARK + json.dumps(results) + "\n")
    sys.__stdout__.flush()


if __name__ == "__main__":
    main()
