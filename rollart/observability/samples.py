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
- `read_samples(path)`, `choose(samples, …)` and `render_text(sample)`: what `rollart samples RUN_DIR` and the
  report show.

Which ones: per domain, `per_domain` trajectories spread over the batch ranked by reward — 1: the median;
2: the worst and the best; 3: worst, median, best; more: evenly spaced ranks between them.

Guarantees: every text field is capped at `max_chars` (its end cut with a mark saying how much), so the file
stays bounded whatever the policy writes; what a policy wrote is data, never markup — JSON-encoded in the
file, indented as a code block in markdown, control characters escaped in the terminal (`printable`). A
resumed run first drops the samples of the steps it will run again, as the metrics file does.
"""

from __future__ import annotations

import json
import unicodedata
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

from rollart.observability.sinks import drop_steps_from
from rollart.types import Trajectory

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

    def __init__(self, path: Path, per_domain: int, decode: Decode, max_chars: int = 4000,
                 text: Callable[[int, str, str], None] | None = None, resume_step: int | None = None) -> None:
        self.per_domain, self.decode, self.max_chars, self.text = per_domain, decode, max_chars, text
        path.parent.mkdir(parents=True, exist_ok=True)
        if resume_step is not None and path.exists():
            drop_steps_from(path, resume_step)
        self._file = path.open("a", encoding="utf-8")

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
def read_samples(path: Path) -> list[dict[str, Any]]:
    """The samples of a run, in file order (a line torn by a crash is skipped)."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and "step" in record and "domain" in record:
            out.append(record)
    return out


def choose(samples: Iterable[Mapping[str, Any]], domain: str | None = None, step: int | None = None,
           rank: str | None = None) -> list[Mapping[str, Any]]:
    """The samples of one step (the last one when `step` is None), optionally of one domain and rank."""
    kept = [s for s in samples if domain is None or s["domain"] == domain]
    if step is None and kept:
        step = max(s["step"] for s in kept)
    return [s for s in kept if s["step"] == step and (rank is None or s["rank"] == rank)]


def printable(text: str) -> str:
    """`text` with control and format characters (terminal escapes among them) shown as escapes."""
    return "".join(c if c in "\n\t" or unicodedata.category(c)[0] != "C" else repr(c)[1:-1] for c in text)


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
    parts = [f"**{sample['rank']}** — {headline(sample)}", *(_code(line) for line in _details(sample))]
    for i, turn in enumerate(sample["turns"], start=1):
        parts.append(f"turn {i} prompt ({turn['prompt_tokens']} tokens):\n\n{_code(turn['prompt'])}")
        parts.append(f"turn {i} response ({turn['response_tokens']} tokens, {turn['finish_reason']}):\n\n"
                     f"{_code(turn['response'])}")
    return "\n\n".join(parts)
