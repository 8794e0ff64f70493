"""What a dataset domain looks like to the model, before training on it (`rollart data preview DOMAIN`).

In: an opened `DatasetDomain` and the domain's `ChatTokens`. Out: `Preview` — a few first prompts exactly as
the model will see them (the token ids the EnvManager sends, decoded: system prompt, template, generation
prompt), the prompt-length histogram of the first `sample` rows in training order, and the report of rows
kept, held out and dropped (with the file, row and column of the first few of each reason).

The prompts are made by the same code a rollout runs (`DatasetEnv.reset`, then `ChatTokens.initial` or
`initial_messages`), so what is shown is what is trained on. `render()` is for a terminal: what the dataset
holds (prompts, answers, file and column names) is shown with control characters escaped
(`rollart.base.untrusted.printable`) — a row's OSC 52 (clipboard), title or colour sequence is shown, never
obeyed; `to_json()` keeps the text as it is (JSON escapes it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from rollart.base.untrusted import printable
from rollart.envs.chat import ChatTokens
from rollart.envs.dataset.env import DatasetDomain, prompt_budget
from rollart.envs.protocol import PROMPT_MESSAGES_KEY, REFERENCE_KEY

BAR = 40  # characters of the histogram's longest bar


@dataclass(frozen=True)
class PromptShown:
    row: str  # `file row N`
    text: str  # the first prompt's ids, decoded
    tokens: int
    answer: str


@dataclass
class Preview:
    domain: str
    report: str
    budget: int
    prompts: list[PromptShown] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)  # first-prompt tokens of the sampled rows
    drops: dict[str, dict[str, Any]] = field(default_factory=dict)  # split → {reason: {count, examples}}

    def histogram(self, bins: int = 10) -> list[tuple[int, int, int]]:
        """(low, high, rows) per bin of the sampled prompt lengths (inclusive bounds)."""
        if not self.lengths:
            return []
        low, high = min(self.lengths), max(self.lengths)
        width = max(1, -(-(high - low + 1) // bins))
        counts = [0] * (-(-(high - low + 1) // width))
        for n in self.lengths:
            counts[(n - low) // width] += 1
        return [(low + i * width, low + (i + 1) * width - 1, c) for i, c in enumerate(counts)]

    def to_json(self) -> dict[str, Any]:
        return {"domain": self.domain, "report": self.report, "budget": self.budget,
                "prompts": [p.__dict__ for p in self.prompts], "lengths": self.lengths,
                "histogram": self.histogram(), "drops": self.drops}

    def render(self) -> str:
        lines = [self.report, ""]
        for split, reasons in self.drops.items():
            for reason, d in reasons.items():
                lines.append(f"dropped from {split}: {d['count']} rows {reason}")
                lines += [f"    {e}" for e in d["examples"]]
        if any(self.drops.values()):
            lines.append("")
        for p in self.prompts:
            lines += [f"── {p.row} · {p.tokens} tokens · answer {p.answer!r}", p.text, ""]
        if self.lengths:
            top = max(c for _, _, c in self.histogram())
            lines.append(f"first-prompt tokens of {len(self.lengths)} training rows (budget {self.budget}): "
                         f"min {min(self.lengths)}, mean {sum(self.lengths) / len(self.lengths):.0f}, "
                         f"max {max(self.lengths)}")
            for lo, hi, count in self.histogram():
                lines.append(f"  {lo:>6}–{hi:<6} {'█' * max(1 if count else 0, round(BAR * count / top)):<{BAR}} {count}")
        return printable("\n".join(lines))


def first_prompt_ids(chat: ChatTokens, observation: str, info: dict[str, Any]) -> list[int]:
    """The ids a rollout's first turn sends (as `EnvManager` makes them)."""
    messages = info.get(PROMPT_MESSAGES_KEY)
    return chat.initial_messages(messages) if messages else chat.initial(observation)


def preview(domain: DatasetDomain, chat: ChatTokens, show: int = 3, sample: int = 2000) -> Preview:
    """The first `show` prompts and the lengths of the first `sample` rows, in training order."""
    rows = domain.rows
    out = Preview(domain.name, rows.report(), prompt_budget(domain.domain_cfg))
    for split, rowset in (("train", rows.train), ("validation", rows.validation)):
        out.drops[split] = {reason: {"count": n, "examples": list(rowset.drops.examples.get(reason, []))}
                            for reason, n in rowset.drops.counts.most_common()}
    env = domain.make_env()
    try:
        for k in range(min(sample, len(rows.train))):
            observation, info = env.reset(k)
            ids = first_prompt_ids(chat, observation, info)
            out.lengths.append(len(ids))
            if k < show:
                reference = info.get(REFERENCE_KEY) or {}
                out.prompts.append(PromptShown(reference.get("source", f"row {k}"), chat.tokenizer.decode(ids),
                                               len(ids), str(reference.get("answer", ""))))
    finally:
        env.close()
    return out
