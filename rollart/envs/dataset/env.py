"""The dataset env kind (`env: dataset`): rows in, an episode out.

In: a domain's config (`data`, `reward`, `options`, token budgets), the domain's `ChatTokens` (the model's
chat template, to measure prompts) and the run seed. Out: `open_dataset_domain(...)` → `DatasetDomain`, whose
`make_env()` builds a `DatasetEnv`; `rows` are the filtered, ordered rows (rows.py) and `report()` what was
kept and dropped.

`DatasetEnv.reset(seed)`: the seed (the EnvManager passes `episode_seed(task)`) says which row — a training
seed s < VAL_OFFSET is the domain's group ordinal s (the scheduler gives dataset domains their ordinals as
seeds), a validation seed is VAL_OFFSET + i for validation row i. The row becomes an episode (`data.episode`,
episodes.py) and is played; the reset info carries:
- `reference`: `answer` (the answer column's final answer: GSM8K's '#### N' read as N), `solution` (the
  answer column's whole text when it held more), `tests`, `entry_point`, `language` (code), `question` (the
  first observation, for the judge), `row` (what user reward functions receive: every column the row carries
  by its name, and every mapped role's value by the role's name over them — `Row.reward_row`) and `source`
  (`file row N`, so a reward error names the row);
- `metrics`: `epoch` and `row` (the trajectory's `data/epoch` and `data/row`);
- `prompt_messages` when the row is a chat (a `messages` column or a per-row `system`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from rollart.config import REWARD_ROLES, DomainConfig
from rollart.envs.dataset.episodes import EPISODE_ROLES, EPISODES
from rollart.envs.dataset.rows import DatasetRows, PromptMeter, Row, build_rows, final_answer, format_prompt
from rollart.envs.dataset.source import DataError, load_table
from rollart.envs.protocol import METRICS_KEY, REFERENCE_KEY
from rollart.envs.seeds import SPLIT_SIZE, VAL_OFFSET
from rollart.envs.adapters.user_object import import_user_object


def prompt_budget(domain_cfg: DomainConfig) -> int:
    """Tokens a dataset row's first prompt may take."""
    assert domain_cfg.data is not None
    return domain_cfg.data.max_prompt_tokens or domain_cfg.max_total_tokens - domain_cfg.max_new_tokens


def episode_constructor(spec: str) -> Callable[..., Any]:
    """The class `data.episode` names: a built-in episode, or `module.path:Class`."""
    if spec in EPISODES:
        return EPISODES[spec]
    if ":" not in spec:
        raise DataError(f"data.episode {spec!r}: a built-in ({', '.join(EPISODES)}) or 'module.path:Class'")
    target = import_user_object(spec, "data.episode", f"a built-in ({', '.join(EPISODES)}) or 'module.path:Class'",
                                DataError)
    if not isinstance(target, type):  # a function of the row and options could be anything (os:system)
        raise DataError(f"data.episode {spec!r} names a {type(target).__name__}, not a class: it must name an env "
                        "class, built as Class(row, **options)")
    return target


def required_roles(domain_cfg: DomainConfig) -> list[str]:
    """The roles a row must have non-empty: the prompt or chat, what its reward and episode read."""
    assert domain_cfg.data is not None
    data = domain_cfg.data
    roles = ["messages" if "messages" in data.columns else "prompt"]
    roles += list(REWARD_ROLES.get(domain_cfg.reward.fn, ()))
    roles += list(EPISODE_ROLES.get(data.episode, ()))
    if data.episode == "tool_lookup":
        roles.append("answer")
    return roles


@dataclass
class DatasetDomain:
    """One dataset domain's rows and how each becomes an episode; `make_env` is its env factory."""

    name: str
    domain_cfg: DomainConfig
    rows: DatasetRows
    episode: Callable[..., Any]

    def make_env(self) -> DatasetEnv:
        return DatasetEnv(self)

    def report(self) -> str:
        return self.rows.report()


def open_dataset_domain(name: str, domain_cfg: DomainConfig, meter: PromptMeter, seed: int) -> DatasetDomain:
    """Read, filter and order a dataset domain's rows (see the module docstring); a `DataError` names what is
    wrong with the file, row and column."""
    data = domain_cfg.data
    if data is None:
        raise DataError(f"domain {name!r} is not a dataset domain (env: dataset with data)")
    episode = episode_constructor(data.episode)
    train = load_table(data.train, data.format, data.columns, split=data.train_split, subset=data.subset)
    validation = (load_table(data.validation, data.format, data.columns, split=data.validation_split,
                             subset=data.subset) if data.validation else None)
    rows = build_rows(name, data, train, validation, required=required_roles(domain_cfg), meter=meter,
                      budget=prompt_budget(domain_cfg), seed=seed)
    return DatasetDomain(name, domain_cfg, rows, episode)


def reference_of(row: Row, observation: str) -> dict[str, Any]:
    """What the reward plane reads of a row (see the module docstring)."""
    values = row.values
    reference: dict[str, Any] = {"row": row.reward_row(), "source": row.location(), "question": observation}
    if values.get("answer") is not None:
        reference["answer"] = final_answer(values["answer"])
        if str(values["answer"]).strip() != reference["answer"]:
            reference["solution"] = str(values["answer"])
    for role in ("tests", "entry_point"):
        if values.get(role) is not None:
            reference[role] = values[role]
    if "tests" in reference:
        reference["language"] = "python"
    return reference


class DatasetEnv:
    """A dataset domain's env: each reset plays one row (see the module docstring)."""

    def __init__(self, domain: DatasetDomain) -> None:
        self.domain = domain
        self.episode: Any = None
        self.row: Row | None = None

    def _pick(self, seed: int | None) -> tuple[Row, int | None]:
        seed = int(seed or 0)
        if seed >= VAL_OFFSET:
            return self.domain.rows.validation_row(seed - VAL_OFFSET), None
        return self.domain.rows.draw(seed % SPLIT_SIZE)

    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        row, epoch = self._pick(seed)
        data = self.domain.domain_cfg.data
        assert data is not None
        values = dict(row.values)
        if "prompt" in data.columns:
            values["prompt"] = format_prompt(data.prompt_format, row.values)
        try:
            self.episode = self.domain.episode(values, **self.domain.domain_cfg.options)
            observation, info = self.episode.reset(seed)
        except Exception as exc:
            raise DataError(f"{row.location()}: episode {data.episode!r} could not start: {type(exc).__name__}: "
                            f"{exc}") from exc
        self.row = row
        info = dict(info or {})
        info[REFERENCE_KEY] = {**reference_of(row, str(observation)), **dict(info.get(REFERENCE_KEY) or {})}
        info[METRICS_KEY] = {"row": float(row.index), **({"epoch": float(epoch)} if epoch is not None else {})}
        return str(observation), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self.episode is None:
            raise RuntimeError("dataset env: step() called before reset()")
        return self.episode.step(action)

    def expert_action(self) -> str:
        return self._episode_method("expert_action")()

    def random_action(self) -> str:
        return self._episode_method("random_action")()

    def _episode_method(self, name: str) -> Callable[[], str]:
        fn = getattr(self.episode, name, None)
        if not callable(fn):
            raise TypeError(f"episode {self.domain.domain_cfg.data.episode!r} has no {name}()")  # type: ignore[union-attr]
        return fn

    def close(self) -> None:
        close = getattr(self.episode, "close", None)
        if callable(close):
            close()

