"""The judge side of the `code` reward: copied into the judge's sandbox as judge.py with tests.json,
wire.py (code_wire.py) and solution.py — read here as text only, never run. Standard library only.

The candidate program runs in another sandbox (code_candidate.py). Each test runs here, in a fresh
namespace where every top-level name the solution defines (functions, classes, variables; builtins
excepted) is a proxy: calling it sends the arguments to the candidate as plain data and returns the plain
data it answers, decoded here into fresh built-in objects (wire.py), or raises the exception it reports
(a built-in exception type by name, else — and for StopIteration, which would end a test's loop
early without a failure — `CandidateError`). So the expected values, the test code and the
verdicts never enter the candidate's process, and nothing it returns can compare equal by trickery. Modules
the solution imports at top level are imported here too when they are in `IMPORTABLE` (tests often use
them without importing). A HumanEval-style test that defines `check(candidate)` is called with the
`entry_point` proxy.

Limits, by design: arguments and results must be plain data (no callables, no instances of the
solution's classes), and a call cannot mutate the test's arguments in place.

Out: one line per test, `{"i": index, "ok": bool, "error": str}`, on this process's original stdout —
which the parent reads — as soon as the test ends; the test code's own prints go to stderr. A candidate
answer over `max_message_bytes`, or a malformed one, ends the exchange: the remaining tests fail.
"""

import ast
import builtins
import importlib
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves the script dir off the path
import wire  # noqa: E402

IMPORTABLE = frozenset({
    "bisect", "cmath", "collections", "copy", "datetime", "decimal", "fractions", "functools", "hashlib",
    "heapq", "itertools", "math", "operator", "random", "re", "statistics", "string", "typing",
})


# never re-raised as themselves: a StopIteration from the candidate would silently end a test's loop
CONTROL_FLOW = (StopIteration, StopAsyncIteration)


class CandidateError(Exception):
    """The candidate failed a call: an exception of a type the judge does not know, or a broken exchange."""


def solution_names(source):
    """(names to proxy, (module, attribute or None, bound name) imports) from the solution's top level."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return set(), []
    names, imports = set(), []

    def visit(body):
        for node in body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for target in getattr(node, "targets", None) or [node.target]:
                    for sub in ast.walk(target):
                        if isinstance(sub, ast.Name):
                            names.add(sub.id)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    imports.append((alias.name, None, alias.asname or alias.name.split(".")[0]))
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    if alias.name != "*":
                        imports.append((node.module, alias.name, alias.asname or alias.name))
            elif isinstance(node, (ast.If, ast.Try, ast.With)):
                visit(node.body)
                for extra in (getattr(node, "orelse", []), getattr(node, "finalbody", []),
                              *[h.body for h in getattr(node, "handlers", [])]):
                    visit(extra)

    visit(tree.body)
    return names - set(dir(builtins)), imports


class Channel:
    def __init__(self, answers, requests_fd, max_bytes):
        self.answers, self.requests_fd, self.max_bytes = answers, requests_fd, max_bytes
        self.broken = ""

    def receive(self):
        if self.broken:
            raise CandidateError(self.broken)
        line = self.answers.readline(self.max_bytes + 1)
        if not line:
            self.broken = "the candidate's process ended"
        elif len(line) > self.max_bytes or not line.endswith(b"\n"):
            self.broken = f"the candidate's answer is over {self.max_bytes} bytes"
        else:
            try:
                return wire.parse_line(line)
            except wire.WireError as exc:
                self.broken = f"the candidate sent a malformed answer: {exc}"
        raise CandidateError(self.broken)

    def send(self, message):
        data = wire.dump_line(message)
        try:
            while data:
                data = data[os.write(self.requests_fd, data):]
        except OSError:
            self.broken = "the candidate's process ended"
            raise CandidateError(self.broken) from None

    def call(self, name, args, kwargs):
        try:
            request = {"call": name, "args": wire.encode(list(args)), "kwargs": wire.encode(dict(kwargs))}
        except wire.WireError as exc:
            raise TypeError(f"only plain data can be passed to the candidate's {name}(): {exc}") from None
        self.send(request)
        answer = self.receive()
        if "ok" in answer:
            try:
                return wire.decode(answer["ok"])
            except (wire.WireError, RecursionError) as exc:
                raise CandidateError(f"{name}() returned malformed data: {exc}") from None
        if "raised" in answer:
            kind, message = str(answer.get("raised"))[:100], str(answer.get("message", ""))[:300]
            cls = getattr(builtins, kind, None)
            if isinstance(cls, type) and issubclass(cls, Exception) and not issubclass(cls, CONTROL_FLOW):
                raise cls(message)
            raise CandidateError(f"{name}() raised {kind}: {message}")
        raise CandidateError(f"{name}(): {str(answer.get('error', 'no answer'))[:300]}")


def proxy(channel, name):
    def call(*args, **kwargs):
        return channel.call(name, args, kwargs)

    call.__name__ = call.__qualname__ = name
    return call


def main():
    verdicts = os.dup(1)
    os.dup2(2, 1)  # the tests' prints must not reach the verdict channel
    answers = os.fdopen(os.dup(0), "rb")
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    requests_fd = os.dup(3)
    os.close(3)

    def report(i, ok, error=""):
        line = json.dumps({"i": i, "ok": ok, "error": error[-300:]}) + "\n"
        os.write(verdicts, line.encode())

    with open("tests.json") as f:
        spec = json.load(f)
    with open("solution.py") as f:
        names, imports = solution_names(f.read())
    tests, entry_point = spec["tests"], spec.get("entry_point")
    if entry_point:
        names.add(entry_point)
    channel = Channel(answers, requests_fd, int(spec["max_message_bytes"]))
    base = {name: proxy(channel, name) for name in names}
    for module, attr, bound in imports:
        if module.split(".")[0] in IMPORTABLE:
            try:
                mod = importlib.import_module(module)
                base[bound] = getattr(mod, attr) if attr else importlib.import_module(module.split(".")[0])
            except (ImportError, AttributeError):
                pass
    try:
        hello = channel.receive()
        if "ready" not in hello:
            channel.broken = f"the solution failed to load: {str(hello.get('load_error', hello))[:300]}"
    except CandidateError:
        pass
    for i, test in enumerate(tests):
        scope = dict(base, __name__="__test__")
        try:
            exec(compile(test, f"test_{i}.py", "exec"), scope)
            check = scope.get("check")
            if entry_point and callable(check) and check is not base.get("check"):
                check(base[entry_point])
            report(i, True)
        except BaseException as exc:  # noqa: BLE001 — any failure (SystemExit included) fails the test
            report(i, False, channel.broken or f"{type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
