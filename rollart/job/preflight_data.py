"""Preflight of dataset domains and of what a reward function asks of their rows (see preflight.py).

In: one domain's config, the shape of its reward function (`rollart.reward.shapes.Shape`, None for a built-in or a
function checked elsewhere) and whether the warm start demonstrates it; then the model's tokenizer. Out: problems,
each naming its key and what would be valid:
- `data_problems` — every split (train and validation) can be read: the file exists in a known format (or the hub
  id is cached or reachable), every mapped column or path is there with a type a row can carry, no split is
  empty, `data.episode` names an episode; the columns the reward function asks for by name (TRL's shape) are a
  column of every split or a mapped role, a verl `compute_score` finds a ground truth, a row-shaped one runs on a
  dataset domain; and under a warm start, each row has an expert: a `single_turn` row's is its answer column
  (`data.columns.answer`), a user episode class needs `expert_action()` (and `random_action()` when
  `train.warm_start.expert_prob` < 1);
- `filter_problems` — under the model's chat template, the domain's `thinking` switch exists and rows are left
  after the filters.
"""

from __future__ import annotations

from typing import Any

from rollart.config import DomainConfig, RunConfig
from rollart.reward.shapes import Shape


def data_problems(name: str, dom: DomainConfig, shape: Shape | None = None, demonstrated: bool = False,
                  expert_prob: float = 1.0, warm_steps: int = 0) -> list[str]:
    """What stops a dataset domain's rows from being read, scored or demonstrated (module docstring)."""
    from rollart.envs.dataset import DataError, load_table
    from rollart.envs.dataset.env import episode_constructor

    data = dom.data
    assert data is not None
    problems: list[str] = []
    sources = [("train", data.train, data.train_split)] + (
        [("validation", data.validation, data.validation_split)] if data.validation else [])
    for key, location, split in sources:
        try:
            table = load_table(location, data.format, data.columns, split=split, subset=data.subset)
        except DataError as exc:
            problems.append(f"domains.{name}.data.{key}: {exc}")
            continue
        problems += reward_column_problems(name, dom, shape, list(table.dataset.column_names), key, location)
    try:
        episode = episode_constructor(data.episode)
    except DataError as exc:
        problems.append(f"domains.{name}.data.episode: {exc}")
        episode = None
    if demonstrated and dom.weight > 0 and episode is not None:
        if problem := expert_problem(name, dom, episode, expert_prob, warm_steps):
            problems.append(problem)
    return problems


def reward_column_problems(name: str, dom: DomainConfig, shape: Shape | None, columns: list[str], split: str,
                           location: str) -> list[str]:
    """The row values a reward function of `shape` needs that this split's rows do not carry."""
    if shape is None:
        return []
    assert dom.data is not None
    roles = list(dom.data.columns)
    have = set(columns) | set(roles)
    key = f"domains.{name}.reward.fn"
    if shape.kind == "trl":
        missing = [c for c in shape.required_columns if c not in have]
        if missing:
            return [f"{key}: {dom.reward.fn} asks for {', '.join(repr(c) for c in missing)} by name (TRL passes the "
                    f"dataset's columns), which data.{split} ({location}) does not have: its columns are {columns} "
                    f"and its mapped roles {roles}; map one, e.g. data.columns.{missing[0]}: <column or a.b path>"]
    if shape.kind == "verl" and not ({"ground_truth", "answer"} & have) and "reward_model" not in columns:
        return [f"{key}: {dom.reward.fn} is a verl compute_score, and data.{split} ({location}) has no ground truth "
                f"for it: map data.columns.ground_truth (or answer), e.g. ground_truth: reward_model.ground_truth"]
    return []


def expert_problem(name: str, dom: DomainConfig, episode: Any, expert_prob: float, warm_steps: int) -> str:
    """Why the warm start cannot demonstrate this dataset domain's rows ('' when it can)."""
    assert dom.data is not None
    how = (f"the warm start (train.warm_start.steps={warm_steps}) demonstrates every trained domain with its "
           "expert's answers")
    off = "or set train.warm_start.steps=0 to start RL from the model as it is"
    if dom.data.episode == "single_turn" and "answer" not in dom.data.columns:
        return (f"domains.{name}.data.columns: {how}, and a single_turn row's expert answer is its answer column, "
                f"which is not mapped: map it (data.columns.answer: <column or a.b path>), {off}")
    if dom.data.episode not in ("single_turn", "tool_lookup"):
        needs = ("expert_action",) + (("random_action",) if expert_prob < 1 else ())
        missing = [m for m in needs if not callable(getattr(episode, m, None))]
        if missing:
            return (f"domains.{name}.data.episode: {dom.data.episode} has no {' or '.join(m + '()' for m in missing)} "
                    f"method; {how}: add it, {off}")
    return ""


def filter_problems(cfg: RunConfig) -> list[str]:
    """What the model's chat template says of each dataset domain (read without problems so far): its thinking
    switch exists, and rows are left after the filters (a prompt over the budget, an empty column)."""
    from rollart.envs.chat import ChatTokens
    from rollart.envs.dataset import DataError, open_dataset_domain
    from rollart.models import load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(cfg.model, cfg.seed), cfg.model.trust_remote_code)
    problems: list[str] = []
    for name, dom in cfg.domains.items():
        if dom.data is None:
            continue
        try:
            open_dataset_domain(name, dom, ChatTokens(tokenizer, dom.system_prompt, dom.thinking), cfg.seed)
        except DataError as exc:
            problems.append(f"domains.{name}.data: {exc}")
        except ValueError as exc:  # a thinking switch the template does not have
            problems.append(f"domains.{name}.thinking: {exc}")
    return problems
