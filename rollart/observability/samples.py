"""Rollouts you can read: a few trajectories per domain of every trained batch, as the model saw and wrote them.

In: per RL step, the batch handed to training (the `Trajectory` records the recorder receives) and `decode`
(token ids → text with the run's tokenizer, special tokens kept, so a prompt reads as the chat template the
model saw). Out:
- `SampleLog.write(step, version, batch)` appends to RUN_DIR/samples.jsonl one JSON object per chosen
  trajectory — step, version, domain, rank (worst … median … best), ids, seed, status and reason, reward (and
  the reward's details when the reward plane gave some), env return, reference, versions, token counts, and
  per turn the prompt text the turn added, the response text, their token counts, the env's reward, the
  finish reason, whether the action was well-formed and the response's policy versions — and hands the same
  as markdown to `text` (TensorBoard's text tab: samples/<domain>);
- `scan_samples(path)` (which steps and domains the file holds, in one streamed pass), `read_samples(path,
  steps)` (the samples of those steps only) and `render_text(sample)`: what `rollart samples RUN_DIR` and the
  report show.

Which ones: per domain, `per_domain` trajectories spread over the batch ranked by reward — 1: the median;
2: the worst and the best; 3: worst, median, best; more: evenly spaced ranks between them.

Guarantees: every text field is capped at `max_chars` (its end cut with a mark saying how much), so the file
stays bounded whatever the policy writes; what a policy wrote is data, never markup — JSON-encoded in the
file, indented as a code block in markdown (the headline escaped as literal Markdown), control characters
escaped in the terminal (`printable`). A resumed run first drops the samples of the steps it will run again,
as the metrics file does. The file is written and read only through `RunPaths` (never through a link).
Reading treats the file as anyone's: it is streamed, never read whole (a line over `MAX_LINE_BYTES` is
skipped, at most `MAX_STEPS` steps are indexed and `MAX_PER_STEP` samples of a step kept), and a line that is
not a well-typed sample (torn by a crash, invalid UTF-8, a field of the wrong type) is skipped and counted
with its line number — so what the terminal or the report shows renders without surprises.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

from rollart.base.run_dir import MAX_LINE_BYTES, RunPaths
from rollart.base.untrusted import loads_json, markdown_text, printable
from rollart.observability.sinks import drop_steps_from
from rollart.types import Trajectory

MAX_STEPS = 1_000_000  # (domain, step) pairs `scan_samples` indexes (a run logs one per RL step and domain)
MAX_PER_STEP = 256  # samples of one step `read_samples` keeps (samples_per_domain × domains, with room)

Decode = Callable[[Sequence[int]], str]


def ranks(n: int, k: int) -> list[tuple[int, str]]:
    """`k` positions spread over `n` trajectories sorted by reward (worst first), each with its name."""
    if n == 0 or k == 0:
        return []
    median = (n - 1) // 2
    if k == 1:
        chosen = [median]
    elif k >= n:
        chosen = list(range(n))
    else:  # evenly spaced, the middle one of an odd k exactly the median
        chosen = sorted({median if 2 * j == k - 1 else round(j * (n - 1) / (k - 1)) for j in range(k)})

    def name(i: int) -> str:
        if n == 1:
            return "only"
        if i == 0:
            return "worst"
        if i == n - 1:
            return "best"
        return "median" if i == median else f"p{round(100 * i / (n - 1))}"

    return [(i, name(i)) for i in chosen]


def cap(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    return text[:max_chars] + f"\n[… {len(text) - max_chars} more characters cut (observability.sample_max_chars)]"


def _versions(versions: Sequence[int]) -> list[int]:
    return [min(versions), max(versions)] if versions else []


def sample_record(step: int, version: int, rank: str, traj: Trajectory, decode: Decode, max_chars: int
                  ) -> dict[str, Any]:
    """One trajectory as samples.jsonl holds it (see the module docstring)."""
    turns = [{
        "prompt": cap(decode(t.prompt_token_ids), max_chars),
        "response": cap(decode(t.response_token_ids), max_chars),
        "prompt_tokens": len(t.prompt_token_ids), "response_tokens": len(t.response_token_ids),
        "env_reward": t.reward, "finish_reason": t.finish_reason, "format_ok": t.format_ok,
        "versions": _versions(t.versions),
    } for t in traj.turns]
    every_version = [v for t in traj.turns for v in t.versions]
    record = {
        "step": step, "version": version, "domain": traj.domain, "rank": rank,
        "trajectory_id": traj.trajectory_id, "group_id": traj.group_id, "seed": traj.task.seed,
        "status": traj.status.value if traj.status else "running", "status_reason": traj.status_reason,
        "reward": traj.reward, "reward_details": dict(traj.reward_details),
        "env_return": traj.env_return, "reference": traj.reference,
        "start_version": traj.start_version, "versions": _versions(every_version),
        "prompt_tokens": sum(t["prompt_tokens"] for t in turns),
        "response_tokens": sum(t["response_tokens"] for t in turns), "turns": turns,
    }
    # the reference and the details are the env's and the reward's data: kept only as far as JSON holds them
    return json.loads(json.dumps(record, default=str))


class SampleLog:
    """Appends the chosen trajectories of every trained batch to samples.jsonl (and to `text`, if given)."""

    def __init__(self, paths: RunPaths, per_domain: int, decode: Decode, max_chars: int = 4000,
                 text: Callable[[int, str, str], None] | None = None, resume_step: int | None = None) -> None:
        self.per_domain, self.decode, self.max_chars, self.text = per_domain, decode, max_chars, text
        if resume_step is not None and os.path.lexists(paths.samples):
            drop_steps_from(paths, paths.samples, resume_step)
        self._file = paths.open(paths.samples, "a")  # never through a link (rollart.base.run_dir)

    def write(self, step: int, version: int, batch: Sequence[Trajectory]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        by_domain: dict[str, list[Trajectory]] = {}
        for traj in batch:
            by_domain.setdefault(traj.domain, []).append(traj)
        for domain, trajs in sorted(by_domain.items()):
            ranked = sorted(trajs, key=lambda t: (t.reward if t.reward is not None else float("-inf"), t.trajectory_id))
            chosen = [sample_record(step, version, name, ranked[i], self.decode, self.max_chars)
                      for i, name in ranks(len(ranked), self.per_domain)]
            for record in chosen:
                self._file.write(json.dumps(record, ensure_ascii=False) + "\n")
            if self.text and chosen:
                self.text(step, f"samples/{domain}", "\n\n".join(render_markdown(r) for r in chosen))
            out += chosen
        self._file.flush()
        return out

    def close(self) -> None:
        self._file.close()


# --- reading and showing ----------------------------------------------------------------------------------
def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    return isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)


_NUMBER, _INT, _STR, _NONE = (int, float), (int,), (str,), (type(None),)
_FIELDS = {  # what the terminal and the report read of a sample, and the types they read it as
    "step": _INT, "version": _INT, "domain": _STR, "rank": _STR, "trajectory_id": _STR, "seed": _INT + _NONE,
    "status": _STR, "status_reason": _STR + _NONE, "reward": _NUMBER + _NONE, "prompt_tokens": _INT,
    "response_tokens": _INT, "versions": (list,), "turns": (list,),
}
_TURN_FIELDS = {"prompt": _STR, "response": _STR, "prompt_tokens": _INT, "response_tokens": _INT,
                "env_reward": _NUMBER, "finish_reason": _STR + _NONE, "format_ok": (bool,), "versions": (list,)}


def _field_problem(record: Mapping[str, Any], fields: Mapping[str, tuple[type, ...]], where: str) -> str:
    for name, kinds in fields.items():
        if not _is(record.get(name), kinds):
            return f"{where}field {name!r} is missing or not a {'/'.join(k.__name__ for k in kinds)}"
    if not all(_is(v, _INT) for v in record["versions"]):
        return f"{where}field 'versions' is not a list of integers"
    return ""


def sample_problem(record: Any) -> str:
    """Why `record` is not a sample as `sample_record` writes it ('' when it is one)."""
    if not isinstance(record, dict):
        return "not a JSON object"
    if why := _field_problem(record, _FIELDS, ""):
        return why
    for i, turn in enumerate(record["turns"]):
        if not isinstance(turn, dict):
            return f"turn {i} is not a JSON object"
        if why := _field_problem(turn, _TURN_FIELDS, f"turn {i}: "):
            return why
    return ""


@dataclass
class Skipped:
    """Lines of samples.jsonl that are not samples, by reason, with the first line numbers of each."""

    counts: Counter[str] = field(default_factory=Counter)
    lines: dict[str, list[int]] = field(default_factory=dict)

    def add(self, reason: str, line: int) -> None:
        self.counts[reason] += 1
        first = self.lines.setdefault(reason, [])
        if len(first) < 3:
            first.append(line)

    def describe(self, path: Path) -> str:
        """One sentence for the terminal or the report ('' when nothing was skipped)."""
        if not self.counts:
            return ""
        parts = [f"{n} {reason} (line {', '.join(map(str, self.lines[reason]))}{', …' if n > 3 else ''})"
                 for reason, n in self.counts.most_common()]
        return f"{path}: lines skipped: " + "; ".join(parts)


def _samples(path: Path, skipped: Skipped) -> Iterator[dict[str, Any]]:
    """The well-typed samples of `path` in file order, streamed; every other line counted in `skipped`."""
    path = Path(path)
    for number, line in RunPaths.of(path.parent).lines(path, MAX_LINE_BYTES):
        if line is None:
            skipped.add(f"longer than {MAX_LINE_BYTES} bytes", number)
            continue
        if not line.strip():
            continue
        try:
            record = loads_json(line.decode("utf-8"))
        except UnicodeDecodeError as exc:
            skipped.add(f"with invalid UTF-8 ({exc.reason})", number)
            continue
        except ValueError:
            skipped.add("not JSON (torn by a crash?)", number)
            continue
        if why := sample_problem(record):
            skipped.add(f"not a sample ({why})", number)
            continue
        yield record


@dataclass
class SampleIndex:
    """What a samples.jsonl holds (`scan_samples`): the steps of each domain, and the lines skipped."""

    steps_by_domain: dict[str, set[int]] = field(default_factory=dict)
    skipped: Skipped = field(default_factory=Skipped)
    truncated: bool = False  # more than MAX_STEPS (domain, step) pairs: the rest of the file was not indexed

    @property
    def domains(self) -> list[str]:
        return sorted(self.steps_by_domain)

    def steps(self, domain: str | None = None) -> list[int]:
        """The steps with samples (of `domain`, if given), in order."""
        if domain is not None:
            return sorted(self.steps_by_domain.get(domain, ()))
        return sorted(set().union(*self.steps_by_domain.values()))


def scan_samples(path: Path) -> SampleIndex:
    """One streamed pass over samples.jsonl: which steps of which domains it holds (memory: the index only)."""
    index = SampleIndex()
    pairs = 0
    for record in _samples(path, index.skipped):
        steps = index.steps_by_domain.setdefault(record["domain"], set())
        if record["step"] not in steps:
            if pairs >= MAX_STEPS:
                index.truncated = True
                break
            steps.add(record["step"])
            pairs += 1
    return index


def read_samples(path: Path, steps: Collection[int], domain: str | None = None) -> list[dict[str, Any]]:
    """The samples of `steps` (of `domain`, if given) in file order, at most `MAX_PER_STEP` per step."""
    kept: list[dict[str, Any]] = []
    per_step: Counter[int] = Counter()
    wanted = set(steps)
    for record in _samples(path, Skipped()):
        if record["step"] in wanted and (domain is None or record["domain"] == domain):
            if per_step[record["step"]] < MAX_PER_STEP:
                per_step[record["step"]] += 1
                kept.append(record)
    return kept


def headline(sample: Mapping[str, Any]) -> str:
    turns = len(sample["turns"])
    reward = "—" if sample["reward"] is None else f"{sample['reward']:.3f}"
    versions = "–".join(str(v) for v in dict.fromkeys(sample["versions"])) or "none"
    reason = f": {sample['status_reason']}" if sample.get("status_reason") else ""
    return (f"step {sample['step']} · {sample['domain']} · {sample['rank']} · reward {reward} "
            f"({sample['status']}{reason}) · {turns} turn{'s' * (turns != 1)}, {sample['prompt_tokens']} prompt + "
            f"{sample['response_tokens']} response tokens · versions {versions}, trained at {sample['version']} · "
            f"{sample['trajectory_id']} (seed {sample['seed']})")


def _details(sample: Mapping[str, Any]) -> list[str]:
    lines = []
    if sample.get("reward_details"):
        lines.append(f"reward details: {json.dumps(sample['reward_details'], ensure_ascii=False)}")
    if sample.get("reference"):
        lines.append(f"reference: {json.dumps(sample['reference'], ensure_ascii=False)}")
    return lines


def render_text(sample: Mapping[str, Any]) -> str:
    """A sample for the terminal: its headline, then each turn's prompt and response as the model saw them."""
    lines = [f"=== {headline(sample)}", *_details(sample)]
    for i, turn in enumerate(sample["turns"], start=1):
        ok = "" if turn["format_ok"] else ", malformed action"
        lines.append(f"--- turn {i} prompt ({turn['prompt_tokens']} tokens)")
        lines.append(turn["prompt"])
        lines.append(f"--- turn {i} response ({turn['response_tokens']} tokens, {turn['finish_reason']}{ok}; "
                     f"env reward {turn['env_reward']:g})")
        lines.append(turn["response"])
    return printable("\n".join(lines))


def _code(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines() or [""])


def render_markdown(sample: Mapping[str, Any]) -> str:
    """A sample for TensorBoard's text tab: the headline, then prompts and responses as code blocks."""
    parts = [f"**{markdown_text(sample['rank'])}** — {markdown_text(headline(sample))}",
             *(_code(line) for line in _details(sample))]
    for i, turn in enumerate(sample["turns"], start=1):
        parts.append(f"turn {i} prompt ({turn['prompt_tokens']} tokens):\n\n{_code(turn['prompt'])}")
        parts.append(f"turn {i} response ({turn['response_tokens']} tokens, {turn['finish_reason']}):\n\n"
                     f"{_code(turn['response'])}")
    return "\n\n".join(parts)
