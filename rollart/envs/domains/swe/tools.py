"""The SWE repair domain's tools: what the policy may do in its workspace, and the text it sees back.

In: a tool call — parsed from the model's text (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`,
the format the tiny model's and Qwen's chat templates teach) or given by an agent's OpenAI client — and the
trajectory's `Workspace` (rollart/sandbox/workspace.py). Out: the tool's result as text (capped at
`max_output_chars`, with a "[truncated]" mark), or a `ToolCallError` saying what was malformed (the env
makes that a turn with the domain's format penalty, never a crash).

Tools (`TOOLS` is their OpenAI schema, for agents):
- `bash {command}`: runs in the workspace sandbox (its own uid, no network, rlimits; `command_timeout_s`);
- `read_file {path}`, `write_file {path, content}`: paths inside the workspace only (the workspace refuses
  anything else: `..`, absolute paths, symlinks out);
- `apply_patch {patch}`: a unified diff applied strictly (rollart/envs/domains/swe/patch.py);
- `run_tests {}`: the package's visible tests;
- `submit {}`: the end: the hidden tests score the package in a fresh sandbox (scoring.py).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Mapping

from rollart.envs.domains.swe.generator import TEST_COMMAND
from rollart.envs.domains.swe.patch import PatchError, apply_patch
from rollart.envs.tool_calls.hermes import parse as parse_hermes

_UNITTEST_TIME = re.compile(r"(Ran \d+ tests?) in [0-9.]+s")
TOOL_NAMES = ("bash", "read_file", "write_file", "apply_patch", "run_tests", "submit")
MAX_READ_BYTES = 64 * 1024


def _tool(name: str, description: str, **params: str) -> dict[str, Any]:
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": {p: {"type": "string", "description": d} for p, d in params.items()},
                       "required": list(params)}}}


TOOLS: tuple[dict[str, Any], ...] = (
    _tool("bash", "Run a shell command in the checkout (no network).", command="the command"),
    _tool("read_file", "Read a file of the checkout.", path="a path relative to the checkout"),
    _tool("write_file", "Replace a file of the checkout.", path="a path relative to the checkout",
          content="the whole new text"),
    _tool("apply_patch", "Apply a unified diff to the checkout.", patch="the diff (--- a/PATH, +++ b/PATH, @@ hunks)"),
    _tool("run_tests", "Run the package's test suite."),
    _tool("submit", "Submit the fix: hidden tests decide the reward. Ends the episode."),
)

INSTRUCTIONS = (
    "Call exactly one tool per turn, as <tool_call>{\"name\": NAME, \"arguments\": {...}}</tool_call>. Tools: "
    "bash {command}, read_file {path}, write_file {path, content}, apply_patch {patch}, run_tests {}, submit {}."
)


class ToolCallError(ValueError):
    """A tool call that is malformed: no call, bad JSON, an unknown tool, missing or wrong arguments."""


@dataclass(frozen=True)
class Call:
    name: str
    arguments: Mapping[str, Any]


_REQUIRED = {"bash": ("command",), "read_file": ("path",), "write_file": ("path", "content"),
             "apply_patch": ("patch",), "run_tests": (), "submit": ()}


def check_call(name: str, arguments: Any) -> Call:
    if name not in _REQUIRED:
        raise ToolCallError(f"unknown tool {name!r:.60}; tools: {', '.join(TOOL_NAMES)}")
    if not isinstance(arguments, Mapping):
        raise ToolCallError(f"{name}: arguments must be a JSON object")
    missing = [a for a in _REQUIRED[name] if not isinstance(arguments.get(a), str)]
    if missing:
        raise ToolCallError(f"{name} needs string argument(s) {', '.join(missing)}")
    return Call(name, {a: arguments[a] for a in _REQUIRED[name]})


def parse_call(text: str) -> Call:
    """The one tool call in a model's text; `ToolCallError` if there is none, or more than one."""
    parsed = parse_hermes(text, TOOL_NAMES, "call")
    if parsed.malformed:
        raise ToolCallError(parsed.malformed)
    if len(parsed.tool_calls) != 1:
        raise ToolCallError("no tool call found" if not parsed.tool_calls else
                            f"{len(parsed.tool_calls)} tool calls; call exactly one per turn")
    call = parsed.tool_calls[0]
    return check_call(call.name, call.arguments)


def call_text(name: str, **arguments: str) -> str:
    """A tool call as the model writes it (the expert's actions)."""
    import json

    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}) + "\n</tool_call>"


def cap(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + f"\n[truncated: {len(text) - max_chars} more characters]"


def command_text(result: Any, max_chars: int) -> str:
    """A `CommandResult` as the policy sees it."""
    status = ("timed out" if result.timed_out else f"stopped by the {result.limit_hit} limit" if result.limit_hit
              else f"exit code {result.exit_code}")
    out = f"[{status}]\n{result.stdout}"
    if result.stderr.strip():
        out += f"\n[stderr]\n{result.stderr}"
    return cap(out, max_chars)


def run_tool(call: Call, workspace: Any, *, timeout_s: float, max_chars: int) -> str:
    """Run one non-final tool (everything but `submit`) in `workspace`; its result as text. A refused
    path or a patch that does not apply is a result the policy reads, not an error of the env."""
    args = call.arguments
    try:
        if call.name == "bash":
            return command_text(workspace.run(args["command"], timeout_s=timeout_s), max_chars)
        if call.name == "run_tests":  # without unittest's timing, so a seed's episode reads the same every time
            return _UNITTEST_TIME.sub(r"\1", command_text(workspace.run(TEST_COMMAND, timeout_s=timeout_s), max_chars))
        if call.name == "read_file":
            return cap(workspace.read_file(args["path"], MAX_READ_BYTES), max_chars)
        if call.name == "write_file":
            workspace.write_file(args["path"], args["content"])
            return f"wrote {args['path']} ({len(args['content'])} characters)"
        if call.name == "apply_patch":
            def read(path: str) -> str | None:
                try:
                    return workspace.read_file(path, MAX_READ_BYTES)
                except FileNotFoundError:
                    return None

            changes = apply_patch(args["patch"], read)
            if any(text is None for text in changes.values()):
                return "patch refused: deleting files is not supported (write the file instead)"
            for path, text in changes.items():
                workspace.write_file(path, text)  # type: ignore[arg-type]
            return "patched " + ", ".join(sorted(changes))
    except PatchError as exc:
        return f"patch did not apply: {exc}"
    except (OSError, ValueError, PermissionError) as exc:
        return f"{call.name} refused: {exc}"
    raise AssertionError(f"run_tool got {call.name}")  # submit is the env's
