"""The candidate side of the `code` reward: copied into the candidate's sandbox as candidate.py and run
there with solution.py (the model's program) and wire.py (code_wire.py). Standard library only.

It holds nothing worth stealing: no tests, no expected values, no verdicts. It loads the solution as the
module `solution`, says `{"ready": true}` (or `{"load_error": "..."}`) to the judge, then answers one call
per line — `{"call": name, "args": [...], "kwargs": {...}}` → `{"ok": value}` | `{"raised": type name,
"message": str}` | `{"error": str}` (a result that is not plain data) — until the judge closes the channel.
Requests come on stdin, answers go to fd 3 (both pipes to the judge's sandbox); the solution gets a
/dev/null stdin, and its prints go to this sandbox's stdout, which nobody parses.

Everything here is in the candidate's reach and may be subverted by it; that is fine, because the judge
trusts only the plain data it decodes itself (code_judge.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # python -I leaves the script dir off the path
import wire  # noqa: E402


_write = os.write  # bound before the solution runs (it may patch os)


def main() -> None:
    requests = os.fdopen(os.dup(0), "rb")
    answers = os.dup(3)
    os.close(3)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)  # a solution that reads input() must not eat the judge's requests
    os.close(null)

    def send(message) -> None:
        data = wire.dump_line(message)
        while data:
            data = data[_write(answers, data):]

    with open("solution.py") as f:
        source = f.read()
    namespace = {"__name__": "solution"}
    try:
        exec(compile(source, "solution.py", "exec"), namespace)
    except BaseException as exc:  # noqa: BLE001 — any failure to load fails every test
        send({"load_error": f"{type(exc).__name__}: {str(exc)[:300]}"})
        return
    sys.stdout.flush()
    send({"ready": True})
    for line in requests:
        try:
            request = wire.parse_line(line)
            fn = namespace.get(request["call"])
            if not callable(fn):
                send({"raised": "NameError", "message": f"name {request['call']!r} is not a callable of the solution"})
                continue
            args = wire.decode(request.get("args", []))
            kwargs = wire.decode(request.get("kwargs", {"dict": []}))
            result = fn(*args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 — the candidate's exception is the call's outcome
            send({"raised": type(exc).__name__, "message": str(exc)[:300]})
            continue
        try:
            line = wire.dump_line({"ok": wire.encode(result)})
        except (ValueError, RecursionError) as exc:  # ValueError: ints over 4300 digits; WireError
            send({"error": f"returned a value that is not plain data: {str(exc)[:200]}"})
            continue
        while line:
            line = line[_write(answers, line):]
        sys.stdout.flush()


if __name__ == "__main__":
    main()
