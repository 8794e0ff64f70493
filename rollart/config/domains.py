"""The `domains` section: each task domain's environment or agent, rows, reward, limits and episode profile.

In: `Section` and the trust markers (`base`), the bounds (`bounds`). Out: `DomainConfig` and what it holds
(`DomainRewardConfig`, `DatasetConfig`, `FaultInjectionConfig`, `DomainProfileConfig` with its `CountConfig`
and `LatencyConfig`), `REWARD_ROLES`, the row roles each built-in reward reads, and `CHEAP_REWARDS`, the
built-ins scored where a trajectory ends.

Guarantees: a domain has exactly one of `env` and `agent`; a dataset domain has its rows, one prompt (or
messages) column and every role its reward reads mapped; an empirical distribution has samples within its
bounds. That a domain's pool is a declared generation pool is checked once the whole config is known
(`rollart.config.run`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from rollart.config.base import TRUST_IMPORT, Section
from rollart.config.bounds import DAY_S, MAX_ENTRIES, MAX_SAMPLES, MAX_SEED, MAX_TOKENS, WEEK_S


class LatencyConfig(Section):
    """A delay: constant = mean_s; gaussian = N(mean_s, std_s) clipped at 0; lognormal with this mean and std
    (of the delay itself); empirical = drawn from `samples` (e.g. env times measured in a run's timeline)."""

    dist: Literal["none", "constant", "gaussian", "lognormal", "empirical"] = Field(
        "none", description="the delay's distribution"
    )
    mean_s: float = Field(0.0, ge=0, le=DAY_S, description="mean delay, seconds")
    std_s: float = Field(0.0, ge=0, le=DAY_S, description="standard deviation of the delay, seconds")
    samples: list[float] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="empirical: the delays to draw from, seconds"
    )

    @model_validator(mode="after")
    def _check_samples(self) -> LatencyConfig:
        if self.dist == "empirical" and not self.samples:
            raise ValueError("dist 'empirical' needs samples (a list of delays in seconds)")
        if any(not 0 <= x <= DAY_S for x in self.samples):
            raise ValueError(f"samples: delays must be ≥ 0 and ≤ {DAY_S:g} s")
        return self


class CountConfig(Section):
    """A count per episode or per turn (turns, tokens): constant = mean; gaussian / lognormal with this mean
    and std, rounded, at least `min`; empirical = drawn from `samples`."""

    dist: Literal["constant", "gaussian", "lognormal", "empirical"] = Field(
        "constant", description="distribution of the count: constant (always `mean`), gaussian, lognormal or "
        "empirical (drawn from `samples`)"
    )
    mean: float = Field(1.0, ge=0, le=MAX_TOKENS, description="mean of the count (the count itself when constant)")
    std: float = Field(0.0, ge=0, le=MAX_TOKENS, description="standard deviation of the count (gaussian, lognormal)")
    min: int = Field(1, ge=0, le=MAX_TOKENS, description="smallest count drawn (a draw below it is raised to it)")
    samples: list[int] = Field(
        default_factory=list, max_length=MAX_SAMPLES, description="empirical: the values to draw from"
    )

    @model_validator(mode="after")
    def _check_samples(self) -> CountConfig:
        if self.dist == "empirical" and not self.samples:
            raise ValueError("dist 'empirical' needs samples (a list of counts)")
        if any(not 0 <= x <= MAX_TOKENS for x in self.samples):
            raise ValueError(f"samples: counts must be ≥ 0 and ≤ {MAX_TOKENS}")
        return self


class DomainProfileConfig(Section):
    """What a domain's episodes look like to the hardware: turns, tokens and env/reward times. Declared here
    (or measured: `profile/<domain>/*` metrics of a run), read by the cluster twin (`rollart sim`) and the
    planner (`rollart plan`); with `rollout.remap`, `rollart train` and the twin compare it with what they
    measure to detect drift."""

    turns: CountConfig = Field(CountConfig(), description="turns per episode (the env ends it; ≤ max_turns)")
    prompt_tokens: CountConfig = Field(CountConfig(mean=256), description="tokens of the first turn's prompt")
    obs_tokens: CountConfig = Field(
        CountConfig(mean=128), description="tokens each later turn adds before generating (observation, template)"
    )
    response_tokens: CountConfig = Field(
        CountConfig(mean=256), description="tokens generated per turn (capped by max_new_tokens)"
    )
    env_reset: LatencyConfig = Field(LatencyConfig(), description="time of env.reset")
    env_step: LatencyConfig = Field(LatencyConfig(), description="time of env.step (besides any `inject` delay)")
    reward: LatencyConfig = Field(LatencyConfig(), description="time to score one trajectory")
    success_rate: float | None = Field(
        None, ge=0, le=1, description="the twin only: the chance an episode scores 1 (else 0), drawn per "
        "trajectory, so a group filter (train.dynamic_sampling) has groups to drop; null = every episode scores 1"
    )


class FaultInjectionConfig(Section):
    """Latency and failures injected around any domain's env (benchmarks and reliability tests)."""

    reset_latency: LatencyConfig = Field(LatencyConfig(), description="delay added to every env reset")
    step_latency: LatencyConfig = Field(LatencyConfig(), description="delay added to every env step")
    reset_fail_prob: float = Field(0.0, ge=0, le=1, description="chance a reset raises (it is then retried)")
    step_fail_prob: float = Field(0.0, ge=0, le=1, description="chance a step raises (the trajectory ends FAILED)")
    hang_prob: float = Field(0.0, ge=0, le=1, description="chance a reset or step hangs until its timeout")
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seeds the injected faults (with the task id and seed)")


class DomainRewardConfig(Section):
    """Which reward scores a domain's trajectories and on which backend.

    `fn`: `env` (the environment's own return), a built-in (`math`, `code`, `format`, `judge`, `exact`,
    `regex`) or `module.path:callable`. A plain string in YAML is shorthand for `{fn: <string>}`.
    """

    fn: str = Field(
        "env", description="env (the environment's own return), a built-in (math, code, format, judge, exact, "
        "regex) or module.path:callable in a shape recognised from its signature: f(trajectory), f(response, row), "
        "TRL's f(completions, **kwargs) -> list[float] (the row's columns by name; once per finished group) or "
        "verl's compute_score(data_source, solution_str, ground_truth, extra_info)",
        json_schema_extra=TRUST_IMPORT,
    )
    backend: Literal["local", "serverless", "http"] | None = Field(
        None, description="where a reward that is not scored at its env worker runs (see `cheap`): local (the "
        "driver's process), serverless (the elastic reward service) or http; set, the domain's reward goes there "
        "even when it is cheap. None = reward.backend"
    )
    cheap: bool | None = Field(
        None, description="a cheap, stateless reward is scored in the env worker the moment its trajectory ends "
        "(in that worker's process; math-verify in a process pool there), not sent to a backend — unless "
        "`backend` is set. None: the rule built-ins (env, format, exact, regex, math) are cheap; code and judge "
        "are not, nor is a user function unless marked true"
    )
    pattern: str = Field(
        "", description="regex reward: a regular expression the response must contain a match of; `{answer}` in "
        "it stands for the reference answer (escaped), e.g. 'answer is {answer}\\b'"
    )

    @model_validator(mode="after")
    def _check_pattern(self) -> DomainRewardConfig:
        if self.fn == "regex":
            if not self.pattern:
                raise ValueError("reward fn 'regex' needs reward.pattern (a regular expression; {answer} = the "
                                 "reference answer)")
            import regex

            try:
                regex.compile(self.pattern.replace("{answer}", "x"))
            except regex.error as exc:
                raise ValueError(f"reward.pattern {self.pattern!r} is not a valid regular expression: {exc}") from None
        elif self.pattern:
            raise ValueError(f"reward.pattern is read by the regex reward only (reward fn is {self.fn!r})")
        return self


# the built-in rewards cheap enough to score where a trajectory ends (stateless rules: no sandbox, no model)
CHEAP_REWARDS = ("env", "format", "exact", "regex", "math")
# which roles a reward fn needs mapped
REWARD_ROLES = {"math": ("answer",), "exact": ("answer",), "regex": ("answer",), "code": ("tests",)}
# verl's Parquet layout (its data preprocessing scripts): the chat in `prompt`, the ground truth inside
# `reward_model`; `data_source`, `ability` and `extra_info` are columns a reward reads by name
VERL_COLUMNS = {"messages": "prompt", "answer": "reward_model.ground_truth"}
# env kinds whose trajectories a program runs through the agent gateway (their adapter `RUNS_AGENT`; a unit test
# keeps this equal to rollart/envs/spec.py's registry)
AGENT_ENV_KINDS = ("verifiers",)


class DatasetConfig(Section):
    """The rows of a dataset domain (`env: dataset`), read with the `datasets` library (Arrow, memory-mapped).

    Each GRPO group takes the next row of its domain: rows are shuffled with the run seed, once per epoch, and
    no row repeats within an epoch (a resumed run continues at the next row). Rows whose mapped columns are
    empty, or whose first prompt (rendered with the model's chat template) is longer than the budget, are
    dropped and counted (`rollart data preview DOMAIN` shows them)."""

    train: str = Field(
        description="the training rows: a JSONL/JSON, Parquet, CSV or Arrow file, a datasets.save_to_disk "
        "directory, or a hub dataset id (online, or cached by the datasets library)"
    )
    validation: str = Field(
        "", description="the validation rows (same forms); empty = a fixed fraction of train is held out (holdout)"
    )
    format: Literal["auto", "json", "parquet", "csv", "arrow", "disk", "hub", "verl"] = Field(
        "auto", description="how to read train and validation: auto = by the file's extension (.jsonl/.json, "
        ".parquet, .csv, .arrow), a directory = save_to_disk, else a hub id; verl = a file in verl's layout, read "
        "by its extension, whose columns map themselves (messages: prompt, answer: reward_model.ground_truth; "
        "data_source, extra_info and every other column reach the reward by name)"
    )
    subset: str = Field("", description="hub datasets: the configuration (subset) name, e.g. 'main' for GSM8K")
    train_split: str = Field("train", description="the split of train to read (hub ids, save_to_disk dicts)")
    validation_split: str = Field("test", description="the split of validation to read (hub ids, save_to_disk dicts)")
    columns: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="role → column, or a dotted path into nested "
        "columns (answer: reward_model.ground_truth): prompt (or messages) is required; answer, tests, entry_point, "
        "system, tools are read by rewards and episodes; any other role is metadata passed to the reward with the "
        "row (which also carries every column by its own name); format verl maps its own, these add to or "
        "override them"
    )
    prompt_format: str = Field(
        "{prompt}", description="the user message made from a row: Python format fields name roles, e.g. "
        "'{prompt}\\nPut the final answer in \\\\boxed{{}}.'"
    )
    holdout: float = Field(
        0.05, gt=0, lt=1, description="without validation: this fraction of train (at least one row) is held out "
        "for validation, chosen with holdout_seed (the same in every run)"
    )
    holdout_seed: int = Field(0, ge=0, le=MAX_SEED, description="seeds which train rows are held out")
    max_prompt_tokens: int | None = Field(
        None, ge=1, le=MAX_TOKENS, description="drop rows whose first prompt is longer, in tokens; None = "
        "max_total_tokens − max_new_tokens of the domain"
    )
    episode: str = Field(
        "single_turn", description="what a row becomes: single_turn (the prompt, one answer), tool_lookup (a "
        "multi-turn tool-use task whose tools and hidden answer come from the row) or module.path:Class (built "
        "as Class(row, **options): an env with reset/step)",
        json_schema_extra=TRUST_IMPORT,
    )

    @model_validator(mode="before")
    @classmethod
    def _layout_columns(cls, data: Any) -> Any:
        """verl's layout maps its own columns; the user's map adds to them (a `prompt` role replaces `messages`)."""
        if isinstance(data, dict) and data.get("format") == "verl":
            given = dict(data.get("columns") or {})
            layout = dict(VERL_COLUMNS)
            if {"prompt", "messages"} & set(given):
                del layout["messages"]
            data = {**data, "columns": {**layout, **given}}
        return data

    @model_validator(mode="after")
    def _check_columns(self) -> DatasetConfig:
        import re
        import string

        if ("prompt" in self.columns) == ("messages" in self.columns):
            raise ValueError("data.columns: map exactly one of `prompt` (a text column) and `messages` (a chat "
                             f"column); got roles {sorted(self.columns)}")
        empty = sorted(role for role, column in self.columns.items() if not column)
        if empty:
            raise ValueError(f"data.columns: roles {empty} name no column")
        if "messages" in self.columns:
            if self.prompt_format != "{prompt}":
                raise ValueError("data.prompt_format is for prompt columns; a messages column is the chat itself")
            return self
        try:
            fields = {re.split(r"[.\[]", f, maxsplit=1)[0]
                      for _, f, _, _ in string.Formatter().parse(self.prompt_format) if f is not None}
        except ValueError as exc:
            raise ValueError(f"data.prompt_format {self.prompt_format!r}: {exc} (write {{{{ and }}}} for braces)") from None
        unknown = sorted(f for f in fields if f not in self.columns)
        if unknown:
            raise ValueError(f"data.prompt_format: fields {unknown} are not mapped roles (data.columns has "
                             f"{sorted(self.columns)}; write {{{{ and }}}} for literal braces)")
        return self


class DomainConfig(Section):
    """One task domain: its environment (or agent), sampling weight, generation pool and reward."""

    env: str = Field(
        "", description="built-in name, an adapter (gem:<id>, gym:<id>, remote:<url>, reasoning_gym:<dataset>, "
        "openenv, verifiers:<taskset>: `rollart env list`) or module.path:Class (or set `agent`)",
        json_schema_extra=TRUST_IMPORT,
    )
    agent: str = Field(
        "", description="module.path:function of an agent written against an OpenAI-compatible client — "
        "async def run(base_url, api_key, task) -> reward | dict | None — run instead of an env; each model "
        "call is a turn",
        json_schema_extra=TRUST_IMPORT,
    )
    agent_timeout_s: float = Field(
        300.0, gt=0, le=WEEK_S, description="an agent trajectory's whole run; past it, FAILED"
    )
    agent_sampling: Literal["run", "request"] = Field(
        "run", description="whose temperature/top_p/top_k/seed an agent's calls use: run = the run's (rollout.* "
        "for training, eval.temperature for validation), request = the agent's own"
    )
    demonstrations: str = Field(
        "", description="agent domains: module.path:function(task, expert) -> {messages, tools}, a conversation "
        "in OpenAI's format (the expert's, or a naive one) for the supervised warm start (none: not warm-started)",
        json_schema_extra=TRUST_IMPORT,
    )
    weight: float = Field(
        1.0, ge=0, le=1e6, description="share of the training groups (relative to the other domains); 0 = evaluated "
        "only"
    )
    pool: str = Field("gen_decode", description="the pool whose inference workers generate for it")
    reward: DomainRewardConfig = DomainRewardConfig()
    max_turns: int = Field(8, ge=1, le=100_000, description="turns before the episode is TRUNCATED")
    max_new_tokens: int = Field(48, ge=1, le=MAX_TOKENS, description="tokens the model may generate per turn")
    max_total_tokens: int = Field(
        2048, ge=16, le=MAX_TOKENS, description="bound on the episode's whole context (prompts, observations and "
        "responses) in tokens; past it the episode is TRUNCATED"
    )
    format_penalty: float = Field(
        -0.1, ge=-1e6, le=1e6, description="reward of a malformed action; the episode goes on"
    )
    end_on_format_error: bool = Field(False, description="end the episode (COMPLETED) on a malformed action")
    options: dict[str, Any] = Field(default_factory=dict, description="keyword arguments of the env")
    env_servers: int = Field(
        0, ge=0, le=1024, description="run this domain's envs in N env servers that rollart places on the "
        "env_server role's pool (env unless roles.env_server says otherwise), replaced when one dies, and reach "
        "them over HTTP as remote envs; 0 = inside the env workers"
    )
    inject: FaultInjectionConfig | None = Field(
        None, description="latency and failures injected around this domain's env; None = none"
    )
    data: DatasetConfig | None = Field(None, description="the rows of a dataset domain (env: dataset)")
    system_prompt: str = Field("", description="system message of every episode's prompt (empty = none)")
    thinking: bool | None = Field(
        None, description="the chat template's thinking switch (enable_thinking, e.g. Qwen3's: false = an empty "
        "<think></think> in the generation prompt); None = the template's default; set only for templates "
        "that have it"
    )
    profile: DomainProfileConfig | None = Field(
        None, description="declared turns/tokens/latencies of an episode: what the cluster twin simulates and the "
        "planner plans for, and what a run with `rollout.remap` compares its measured profile with (None: the "
        "twin and planner take its kind's default, a run what its first episodes measured)"
    )

    @field_validator("reward", mode="before")
    @classmethod
    def _reward_shorthand(cls, value: Any) -> Any:
        return {"fn": value} if isinstance(value, str) else value

    @property
    def runs_agent(self) -> bool:
        """Whether a program runs this domain's trajectories through the agent gateway: an `agent`, or an env
        kind that is one (`AGENT_ENV_KINDS`, e.g. verifiers:<taskset>)."""
        return bool(self.agent) or self.env.strip().partition(":")[0] in AGENT_ENV_KINDS

    @model_validator(mode="after")
    def _env_or_agent(self) -> DomainConfig:
        if bool(self.env) == bool(self.agent):
            raise ValueError("a domain needs exactly one of `env` (an environment) and `agent` "
                             f"(module.path:function); got env={self.env!r}, agent={self.agent!r}")
        if self.env_servers and (self.runs_agent or self.env.startswith("remote:") or self.env.strip() == "dataset"):
            raise ValueError("`env_servers` serves an env of this config (not an agent, not a dataset, whose rows "
                             f"run in process, not remote:<url>, served already); got env={self.env!r}, "
                             f"agent={self.agent!r}")
        if self.demonstrations and not self.runs_agent:
            raise ValueError("`demonstrations` is for agent domains (env domains are demonstrated by their "
                             "env's expert_action)")
        if (self.env == "dataset") != (self.data is not None):
            raise ValueError("`env: dataset` and `data` go together: a dataset domain reads its rows from `data` "
                             f"(got env={self.env!r}, data {'set' if self.data else 'unset'})")
        if self.data is not None:
            if self.data.max_prompt_tokens is None and self.max_total_tokens <= self.max_new_tokens:
                raise ValueError(f"max_total_tokens ({self.max_total_tokens}) leaves no room for a prompt beside "
                                 f"max_new_tokens ({self.max_new_tokens}); raise it or set data.max_prompt_tokens")
            missing = [r for r in REWARD_ROLES.get(self.reward.fn, ()) if r not in self.data.columns]
            if missing:
                raise ValueError(f"reward fn {self.reward.fn!r} reads the row's {missing[0]!r}: map it in "
                                 f"data.columns (e.g. {missing[0]}: <column>)")
        return self
