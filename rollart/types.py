"""Records and protocols that cross plane boundaries.

Every value that travels between planes (control → envs → inference → reward → trainer) is one of the
frozen dataclasses below, never a loose dict. Planes depend on this module and on `rollart.config`, never
on each other; the driver wires them with the objects that implement the protocols at the bottom.

Guarantees:
- Token-in/token-out: `Turn.response_token_ids` are exactly the ids the engine produced, with one
  behaviour logprob and one policy version per token; `Trajectory.token_ids()` is the concatenation of
  every turn's new prompt ids and response ids, so the trainer trains on what was sampled, never on a
  re-tokenisation. A trajectory whose agent rewrote its history has several segments
  (`Trajectory.segments()`), each one sequence the model really saw; token views are per segment.
- Records are immutable; a plane that extends one uses `dataclasses.replace` (see `Trajectory.with_turn`).
"""

from __future__ import annotations

import enum
import json
from dataclasses import dataclass, field, replace
from typing import Any, Iterable, Literal, Mapping, Protocol, Sequence, runtime_checkable


class Status(str, enum.Enum):
    """How a trajectory ended. Only COMPLETED and TRUNCATED trajectories are trainable."""

    COMPLETED = "completed"  # the environment terminated the episode
    TRUNCATED = "truncated"  # max turns / max tokens / env truncation
    ABORTED = "aborted"  # cancelled by the scheduler (redundancy, shutdown)
    FAILED = "failed"  # env or reward raised, or timed out past its retries
    STALE = "stale"  # exceeded the staleness bound α before it finished

    @property
    def trainable(self) -> bool:
        return self in (Status.COMPLETED, Status.TRUNCATED)


Split = Literal["train", "val"]


@dataclass(frozen=True)
class Task:
    """One episode to run: which domain, which env spec, which seed, which GRPO group it belongs to."""

    trajectory_id: str  # the id of the trajectory that runs this task
    domain: str
    env: str  # env spec as written in config: built-in name, gem:<id>, gym:<id> or module.path:Class
    seed: int
    group_id: str
    split: Split = "train"
    temperature: float | None = None  # sampling temperature of its turns; None = its split's (rollout / eval)


@dataclass(frozen=True)
class UpcomingGroup:
    """A GRPO group the control plane expects to admit next (its forecast, not a promise): `size` members
    of `task` (the first member's task; the others differ only in their trajectory ids). The env plane may
    prepare their envs ahead — a warm pool writes the task's files into workspaces before the resets ask."""

    task: Task
    size: int


@dataclass(frozen=True)
class Span:
    """A timed piece of a trajectory's life, for step-time breakdowns and the Chrome-trace timeline.

    `name` is one of: env.reset, generate, env.step, reward, buffer.wait (free-form names are allowed).
    Times are `time.time()` seconds (wall clock, comparable across processes on one machine).
    """

    name: str
    start: float
    end: float
    worker: str = ""  # e.g. "inference/gen_prefill/0", "env/0", "reward/serverless"

    @property
    def duration(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class SamplingParams:
    """How to sample one generation. Validated by the engine (a bad value raises ValueError naming it)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    max_new_tokens: int = 64
    stop_token_ids: tuple[int, ...] = ()
    stop_strings: tuple[str, ...] = ()
    seed: int | None = None
    ignore_eos: bool = False  # True: do not stop at the model's EOS ids (stop_token_ids still stop)
    # Constrained decoding: a grammar in llguidance's Lark dialect (`start: ...`, a JSON schema as `%json{...}`,
    # a token by id as `<[123]>`). The engine samples only tokens it allows, and the stop tokens only where it
    # accepts; the tokens and logprobs recorded are those sampled under it (rollart/inference/constrained.py).
    grammar: str | None = None
    top_logprobs: int = 0  # also report the k most probable tokens at each position (their id and logprob), k ≤ 20


@dataclass(frozen=True)
class GenerationRequest:
    """One turn's generation: the full context as token ids (engines may reuse a cached prefix of it)."""

    request_id: str
    trajectory_id: str
    domain: str
    prompt_token_ids: tuple[int, ...]
    sampling: SamplingParams = field(default_factory=SamplingParams)


FinishReason = Literal["stop", "length", "abort"]


@dataclass(frozen=True)
class GenerationResult:
    """What the engine produced for a request: tokens with their behaviour logprob and policy version."""

    request_id: str
    trajectory_id: str
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]  # policy version that produced each token
    finish_reason: FinishReason
    prompt_tokens: int = 0  # length of the context
    prefill_tokens: int = 0  # context tokens actually computed (the rest: a cached prefix, or another request's same prompt)
    worker: str = ""
    spans: tuple[Span, ...] = ()
    # with `SamplingParams.top_logprobs` = k: per token, the k most probable (token id, logprob) of the
    # distribution it was sampled from, most probable first; () otherwise
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()


@dataclass(frozen=True)
class Turn:
    """One generate → act step of a trajectory.

    `prompt_token_ids` are the ids this turn added to the context before generation (turn 0: the whole
    initial prompt; later turns: the end of the previous assistant message, the observation and the next
    generation prompt under the chat template). `response_token_ids` are the model's tokens, trained on.
    """

    prompt_token_ids: tuple[int, ...]
    response_token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    versions: tuple[int, ...]
    observation: str = ""
    action: str = ""
    reward: float = 0.0  # the environment's per-step reward
    finish_reason: FinishReason = "stop"
    format_ok: bool = True
    spans: tuple[Span, ...] = ()
    # which token sequence this turn extends: a turn whose segment differs from the previous turn's starts
    # a new sequence (its prompt ids are the whole context) — an agent that rewrote earlier messages
    segment: int = 0

    def __post_init__(self) -> None:
        n = len(self.response_token_ids)
        if len(self.logprobs) != n or len(self.versions) != n:
            raise ValueError(
                f"Turn needs one logprob and one version per response token: {n} tokens, "
                f"{len(self.logprobs)} logprobs, {len(self.versions)} versions"
            )


# A user agent's own metrics sit in `Trajectory.metrics` under this prefix (`agent/<name>`), apart from the
# env plane's counters; the observability plane logs them per domain as `env/<domain>/agent/<name>`.
AGENT_METRIC_PREFIX = "agent/"
# An env's own numbers from its reset info (a dataset row's epoch and row) sit in `Trajectory.metrics` under
# this prefix; the observability plane logs them per domain as `env/<domain>/data/<name>`.
DATA_METRIC_PREFIX = "data/"


MAX_TRACEBACK_CHARS = 8000


@dataclass(frozen=True)
class Fault:
    """Why a FAILED trajectory failed when its domain's own code raised — the env (`reset`, `step`, its
    constructor), the agent (it raised, returned nothing usable, called no model) or its reward function (it
    raised or returned something that is not a score) — as opposed to the infrastructure (a worker that died,
    generation or a reward service out, a timeout): what the rollout's per-domain circuit breaker counts
    (`rollout.circuit_breaker`)."""

    where: str  # what raised: "env.step", "env.reset", "agent", "reward", …
    error: str  # "TypeError: create() got an unexpected keyword argument 'n'"
    traceback: str = ""  # the formatted traceback, its end kept when long

    @classmethod
    def of(cls, where: str, exc: BaseException) -> Fault:
        import traceback

        text = "".join(traceback.format_exception(exc)).rstrip()
        if len(text) > MAX_TRACEBACK_CHARS:
            text = "[…]\n" + text[-MAX_TRACEBACK_CHARS:]
        return cls(where, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, text)


@dataclass(frozen=True)
class Trajectory:
    """A whole episode, from reset to its end, as the env plane hands it to reward and the buffer."""

    trajectory_id: str
    task: Task
    start_version: int
    turns: tuple[Turn, ...] = ()
    status: Status | None = None  # None while running
    status_reason: str = ""
    reward: float | None = None  # the trajectory's score, set by the reward plane
    reward_details: Mapping[str, Any] = field(default_factory=dict)  # why that score (the reward's details)
    fault: Fault | None = None  # FAILED by its domain's own code: what raised, and its traceback
    env_return: float = 0.0  # sum of per-step environment rewards
    reference: Mapping[str, Any] = field(default_factory=dict)  # from env reset info: answer, tests …
    metrics: Mapping[str, float] = field(default_factory=dict)
    spans: tuple[Span, ...] = ()  # reset, reward, buffer wait (turn spans live on the turns)

    @property
    def domain(self) -> str:
        return self.task.domain

    @property
    def group_id(self) -> str:
        return self.task.group_id

    def with_turn(self, turn: Turn) -> Trajectory:
        return replace(self, turns=self.turns + (turn,))

    def finished(
        self, status: Status, reason: str = "", metrics: Mapping[str, float] | None = None,
        fault: Fault | None = None,
    ) -> Trajectory:
        merged = {**self.metrics, **(metrics or {})}
        return replace(self, status=status, status_reason=reason, metrics=merged, fault=fault or self.fault)

    def scored(self, reward: float, spans: Sequence[Span] = (), details: Mapping[str, Any] | None = None
               ) -> Trajectory:
        # a reward fn's details are its own data: kept as far as JSON holds them (checkpoints, samples)
        kept = json.loads(json.dumps(dict(details), default=str)) if details else self.reward_details
        return replace(self, reward=float(reward), spans=self.spans + tuple(spans), reward_details=kept)

    # --- token views used by the trainer and the staleness policy ---------------------------------
    def segments(self) -> tuple[Trajectory, ...]:
        """The trajectory cut where a turn starts a new segment: each part (same id, task and status) holds
        the turns of one token sequence. A trajectory of one segment (every env trajectory) is itself."""
        parts: list[list[Turn]] = []
        for turn in self.turns:
            if not parts or turn.segment != parts[-1][-1].segment:
                parts.append([])
            parts[-1].append(turn)
        if len(parts) <= 1:
            return (self,)
        return tuple(replace(self, turns=tuple(p)) for p in parts)

    def _one_segment(self) -> None:
        if any(a.segment != b.segment for a, b in zip(self.turns, self.turns[1:])):
            raise ValueError(
                f"trajectory {self.trajectory_id} has several token segments (its agent rewrote its history): "
                "take token views of each of segments()"
            )

    @property
    def num_tokens(self) -> int:
        """Prompt and response tokens over every turn (of every segment)."""
        return sum(len(t.prompt_token_ids) + len(t.response_token_ids) for t in self.turns)

    def token_ids(self) -> list[int]:
        """The one token sequence of a single-segment trajectory (ValueError for several)."""
        self._one_segment()
        ids: list[int] = []
        for t in self.turns:
            ids.extend(t.prompt_token_ids)
            ids.extend(t.response_token_ids)
        return ids

    def loss_mask(self) -> list[int]:
        self._one_segment()
        mask: list[int] = []
        for t in self.turns:
            mask.extend([0] * len(t.prompt_token_ids))
            mask.extend([1] * len(t.response_token_ids))
        return mask

    def behaviour_logprobs(self) -> list[float]:
        """One entry per token of `token_ids()`; 0.0 on prompt tokens (masked out)."""
        self._one_segment()
        out: list[float] = []
        for t in self.turns:
            out.extend([0.0] * len(t.prompt_token_ids))
            out.extend(t.logprobs)
        return out

    def token_versions(self) -> list[int]:
        """One entry per token of `token_ids()`; prompt tokens carry -1 (no policy produced them)."""
        self._one_segment()
        out: list[int] = []
        for t in self.turns:
            out.extend([-1] * len(t.prompt_token_ids))
            out.extend(t.versions)
        return out

    @property
    def min_token_version(self) -> int:
        """Oldest policy version among the generated tokens (start_version if none were generated)."""
        versions = [v for t in self.turns for v in t.versions]
        return min(versions) if versions else self.start_version

    @property
    def num_response_tokens(self) -> int:
        return sum(len(t.response_token_ids) for t in self.turns)


@dataclass(frozen=True)
class RewardResult:
    """The score of one trajectory. `attempts` counts client tries; the service scores each key once."""

    trajectory_id: str
    reward: float
    ok: bool = True
    error: str = ""
    attempts: int = 1
    backend: str = "local"
    latency_s: float = 0.0
    details: Mapping[str, Any] = field(default_factory=dict)
    fault: Fault | None = None  # not ok because the reward function itself raised (the domain's fault)


@dataclass(frozen=True)
class TrainSample:
    """One trajectory as the trainer sees it: tokens, mask, behaviour logprobs/versions, advantage."""

    trajectory_id: str
    group_id: str
    domain: str
    token_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    behaviour_logprobs: tuple[float, ...]
    token_versions: tuple[int, ...]
    advantage: float
    reward: float


@dataclass(frozen=True)
class TrainBatch:
    """What the driver hands the trainer for one step; `version` is the policy version being trained."""

    version: int
    samples: tuple[TrainSample, ...]


@dataclass(frozen=True)
class Evaluation:
    """Validation scores at one moment: per domain, the mean score of its scored episodes (a domain with
    none scored has no score), how many episodes were scored and how many failed — an episode that kept
    failing for an infrastructure reason is counted here, never averaged in as 0. With `eval.samples` = n
    > 0, also per domain `pass_at_k` {k: the unbiased pass@k over the episodes} and `avg_at_n` (the mean
    score of the n samples per episode)."""

    scores: Mapping[str, float]
    scored: Mapping[str, int]
    failed: Mapping[str, int]
    pass_at_k: Mapping[str, Mapping[int, float]] = field(default_factory=dict)
    avg_at_n: Mapping[str, float] = field(default_factory=dict)

    @property
    def mean(self) -> float | None:
        return sum(self.scores.values()) / len(self.scores) if self.scores else None


@dataclass(frozen=True)
class TimedMetrics:
    """What one of the driver's phases (a weight sync, a train step, the wait for a batch) reports: its
    metrics (`<namespace>/<name>` keys) and the span it took on the run's timeline — None when the phase
    had nothing to do (e.g. a weight sync when the engines already serve the newest version)."""

    metrics: Mapping[str, float]
    span: Span | None = None


@dataclass(frozen=True)
class RunState:
    """Where an RL run stands: what a checkpoint carries for the driver, beside the trainer's own state.

    `step`: RL steps done (the next step to run; 0 for a fresh run). `scheduler`: the control plane's
    `state_dict()`, so a resumed run admits the same groups in the same order (None: start afresh).
    `eval_first`: the scores of the run's first evaluation, the baseline every summary compares with (None
    until it has run). `run_id`: the run's random id ("" before it has one) and `attempt`: how many times it
    was started before the start that wrote this state — together they keep the run's reward idempotency
    keys apart from every other run's and from its own earlier starts (a resume keeps the id, one more
    attempt: `restart_identity`). `ledger_bytes`: how much of the run's ledger file the checkpoint covers (a
    resumed run cuts it there: what happened after the checkpoint is undone). `wall_s`: the run's wall time
    over all its attempts when the checkpoint was taken (a resumed run's summary counts on from it). The
    trainer stores it opaquely
    in the checkpoint's `extra_state`, as the plain dict of `to_checkpoint`; `from_checkpoint` is the one
    place that dict is read.
    """

    step: int = 0
    scheduler: Mapping[str, Any] | None = None
    eval_first: Mapping[str, float] | None = None
    run_id: str = ""
    attempt: int = 0
    ledger_bytes: int = 0
    wall_s: float = 0.0

    def to_checkpoint(self) -> dict[str, Any]:
        return {"step": self.step, "scheduler": self.scheduler, "eval_first": self.eval_first,
                "run_id": self.run_id, "attempt": self.attempt, "ledger_bytes": self.ledger_bytes,
                "wall_s": self.wall_s}

    @classmethod
    def from_checkpoint(cls, extra_state: Mapping[str, Any]) -> RunState:
        """The run state in a checkpoint's `extra_state` (a fresh run's when it holds none). ValueError naming
        the field for a value of the wrong kind (a checkpoint is data from the run directory: it is
        checked, not trusted)."""

        def count(field: str) -> int:
            value = extra_state.get(field, 0)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"field {field!r} must be an integer ≥ 0, got {value!r:.80}")
            return value

        run_id = extra_state.get("run_id") or ""
        scheduler, eval_first = extra_state.get("scheduler"), extra_state.get("eval_first")
        if not isinstance(run_id, str):
            raise ValueError(f"field 'run_id' must be a string, got {run_id!r:.80}")
        if scheduler is not None and not isinstance(scheduler, Mapping):
            raise ValueError(f"field 'scheduler' must be an object or null, got {scheduler!r:.80}")
        if eval_first is not None and not (isinstance(eval_first, Mapping) and all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                for k, v in eval_first.items())):
            raise ValueError(f"field 'eval_first' must map domains to scores, or be null; got {eval_first!r:.80}")
        wall = extra_state.get("wall_s", 0.0)
        if not isinstance(wall, (int, float)) or isinstance(wall, bool) or not 0 <= wall < float("inf"):
            raise ValueError(f"field 'wall_s' must be a number of seconds ≥ 0, got {wall!r:.80}")
        return cls(step=count("step"), scheduler=scheduler, eval_first=eval_first, run_id=run_id,
                   attempt=count("attempt"), ledger_bytes=count("ledger_bytes"), wall_s=float(wall))

    def restart_identity(self, fresh_run_id: str) -> tuple[str, int]:
        """(run id, attempt) of a start from this state: the same run one attempt later, or — when this state
        has no run id (a fresh run) — `fresh_run_id` at attempt 0."""
        return (self.run_id, self.attempt + 1) if self.run_id else (fresh_run_id, 0)


@dataclass(frozen=True)
class LoraAdapter:
    """A LoRA adapter in PEFT's format: what a LoRA run (`train.lora`) publishes instead of full weights.

    Engine-agnostic: the two parts are exactly what PEFT writes as `adapter_config.json` (`config`: r,
    lora_alpha, use_rslora, target_modules, …) and `adapter_model.safetensors` (`tensors`: names like
    `base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight` → lora_A [r, in] / lora_B [out, r]).
    The base weights are the run's `model.path` (the tiny model when empty), which every engine already
    loaded; an engine serves W = W_base + s·B·A with s = lora_alpha / r (`rollart.models.lora`).
    """

    config: Mapping[str, Any]
    tensors: Mapping[str, Any]

    @property
    def nbytes(self) -> int:
        return sum(int(t.numel()) * t.element_size() for t in self.tensors.values())


@dataclass(frozen=True)
class Affinity:
    """Where a worker wants to run: a preferred pool and compatible fallbacks, in order."""

    pool: str
    fallback: tuple[str, ...] = ()


# --- Protocols at plane boundaries (implementations live in the planes; the driver wires them) -------


@runtime_checkable
class LLMClient(Protocol):
    """What an EnvManager calls to generate; the inference plane's LLMProxy implements it (env workers
    reach the proxy actor through `rollart.envs.ActorLLMClient`)."""

    async def generate(self, request: GenerationRequest) -> GenerationResult: ...

    async def abort(self, trajectory_id: str) -> None: ...


@runtime_checkable
class RewardScorer(Protocol):
    """Scores a finished trajectory; the reward plane's clients (local, serverless, http) implement it."""

    async def score(self, trajectory: Trajectory) -> RewardResult: ...


@runtime_checkable
class GroupRewardScorer(RewardScorer, Protocol):
    """A scorer that can score a finished group with one call where the domain's reward function takes a batch
    (TRL's shape): `scores_groups(domain)` says whether it does; `score_group` returns one result per
    trajectory, in order."""

    def scores_groups(self, domain: str) -> bool: ...

    async def score_group(self, trajectories: Sequence[Trajectory]) -> list[RewardResult]: ...


@runtime_checkable
class EndScorer(Protocol):
    """The reward scored where a trajectory ends: for the domains in `domains` (a cheap, stateless reward),
    the env plane's worker scores each trajectory the moment it ends, in its own process, before handing it
    on — instead of the control plane sending it to a reward backend. The reward plane implements it; the
    composition root (`rollart.job`) gives one to each env worker, picklable until `start()`, which the
    worker calls once in its own process (pools, imports). `score` never raises: a reward that kept failing
    is a `RewardResult` with `ok=False`; it is bounded by the reward's own timeout."""

    domains: frozenset[str]

    def start(self) -> None: ...

    async def score(self, trajectory: Trajectory) -> RewardResult: ...

    def close(self) -> None: ...


@runtime_checkable
class TrajectoryRunner(Protocol):
    """What the control plane calls to run episodes; the env plane's worker pool implements it.

    `run` returns when the trajectory has ended (status set, not yet scored). `cancel` ends a running
    trajectory early with the given status (ABORTED or STALE): its generation is aborted, its env closed,
    and its `run` returns the partial trajectory with that status. Cancelling an unknown or finished id is
    a no-op. `progress` reports, per running trajectory, the oldest policy version among its tokens (or
    None before the first token) — what per-token staleness needs. `expect` is a hint: the group the control
    plane will likely admit next, so its envs can be prepared ahead (a wrong forecast costs a prepared env
    that is closed unused, never a wrong episode); it returns at once and never fails the caller.
    """

    async def run(self, task: Task, start_version: int) -> Trajectory: ...

    async def cancel(self, trajectory_id: str, status: Status, reason: str) -> None: ...

    async def progress(self) -> dict[str, int | None]: ...

    async def expect(self, group: UpcomingGroup) -> None: ...


@runtime_checkable
class TurnBarrier(Protocol):
    """A per-turn barrier (`rollout.barrier=turn`): a trajectory waits before each turn's generation until
    every trajectory of its cohort has reached that turn or left. With no barrier there is none.
    The control plane's scheduler `join`s each trajectory to its cohort before it starts; the env plane
    calls `before_turn` and `leave`."""

    async def join(self, trajectory_id: str, cohort: int) -> None: ...

    async def before_turn(self, trajectory_id: str, turn_index: int) -> None: ...

    async def leave(self, trajectory_id: str) -> None: ...


@runtime_checkable
class GroupFilter(Protocol):
    """Which complete groups enter the batch: the algorithm plane's filter (DAPO's dynamic sampling drops a
    group whose rewards are all equal), which the control plane asks about each group once its members are
    scored, without knowing which algorithm runs. None keeps the group; a reason drops it."""

    def __call__(self, group: Sequence[Trajectory]) -> str | None: ...


@runtime_checkable
class LedgerSink(Protocol):
    """Where the control plane writes each move of its ledger as it happens (a JSON object: time, id, group,
    domain, fate, and reason, digest, batch where they apply); the run's ledger file implements it
    (`rollart.observability.ledger.LedgerFile`)."""

    def write(self, entry: Mapping[str, Any]) -> None: ...


@runtime_checkable
class WeightPublisher(Protocol):
    """The trainer's side of the weight store: publish one policy version — the named tensors of the full
    weights (a mapping, or (name, tensor) pairs consumed one at a time: a sharded trainer gathers each just
    before it is taken), or a `LoraAdapter` (a LoRA run: only the adapter tensors travel). `replace`: publish
    again a version published before, with the same tensors (a trainer rebuilt after a rank died); `latest()`:
    the newest version the store holds (-1: none) — a rank may die after publishing a version it never reported."""

    def publish(
        self, version: int, weights: Mapping[str, Any] | Iterable[tuple[str, Any]] | LoraAdapter,
        replace: bool = False,
    ) -> Mapping[str, float]: ...

    def latest(self) -> int: ...


@runtime_checkable
class ShardPublisher(Protocol):
    """A trainer-side weight publisher every rank calls with its own rows (`weights.transport=collective`):
    `publish_rows(version, rank, world_size, specs, chunks)` — `specs` (checkpoint names, dtype, full shape)
    per tensor, `chunks` this rank's rows of each along dim 0, in the same order — raises when it cannot
    carry the version; `fell_back()` says (non-empty) that the run's weights go through `store` from now on;
    `receivers_joined()` whether the group can form now (until then a version goes through `store`, and the
    group forms at a later one); `store` is the `WeightPublisher` of both (rank 0 publishes full tensors)."""

    store: WeightPublisher

    def fell_back(self) -> str: ...

    def receivers_joined(self) -> bool: ...

    def publish_rows(self, version: int, rank: int, world_size: int,
                     specs: Sequence[tuple[tuple[str, ...], str, tuple[int, ...]]],
                     chunks: Iterable[Any]) -> Mapping[str, float]: ...


@runtime_checkable
class LentEngine(Protocol):
    """An inference engine a trainer rank runs on its own weights while it waits for a batch
    (`train.elastic_generation`; built in the rank's process by the factory the job injects). `serve(version,
    weights)` starts serving — `weights` as a `WeightPublisher` takes them, the rank's own tensors (adopted, not
    copied, where dtype and device match) —; `stop(timeout_s)` ends every request it holds (each returns aborted
    with its tokens so far) and drops its caches before the rank trains again, returning `preempted` (how many
    it ended) and `busy_s` (the seconds it spent generating since `serve`).
    Between the two it answers the inference worker's calls, from any thread: `submit(channel, items)` and
    `take(channel, wait_s)` (the batched `generate`), `abort(trajectory_id)`, `preempt(trajectory_id)`,
    `ready()` (its name), `stats()`; a request that comes while it is not serving returns aborted at once."""

    def serve(self, version: int, weights: Mapping[str, Any] | Iterable[tuple[str, Any]] | LoraAdapter) -> None: ...

    def stop(self, timeout_s: float) -> dict[str, float]: ...

    def submit(self, channel: str, items: list[tuple[int, GenerationRequest]]) -> None: ...

    def take(self, channel: str, wait_s: float) -> list[tuple[int, Any, BaseException | None]]: ...

    def abort(self, trajectory_id: str) -> None: ...

    def preempt(self, trajectory_id: str) -> None: ...

    def ready(self) -> str: ...

    def stats(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@runtime_checkable
class WeightSubscriber(Protocol):
    """The inference side: newest published version, and that version's weights (pulled in buckets) —
    `{name: tensor}` for full weights, a `LoraAdapter` for an adapter-only version. Coroutines: an inference
    worker awaits them on the event loop that serves its requests, which a blocking wait would stall."""

    async def latest_version(self) -> int: ...

    async def pull(self, version: int) -> dict[str, Any] | LoraAdapter: ...
