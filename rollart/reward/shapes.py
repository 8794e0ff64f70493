"""The shapes of reward function rollart calls, recognised from the function's signature, and the adapter that
calls each one the way its own framework does.

In: a user's callable (`domains.<d>.reward.fn: module.path:callable`; a class is instantiated once with no
arguments). Out: `shape_of(fn)` → a `Shape`, or `RewardShapeError` naming the accepted shapes; `ShapedReward` —
the function as a reward of one trajectory (what every backend calls) and, for TRL's batched shape,
`score_batch` for a whole group at once. The shapes, checked in this order:

- `verl` — parameters `solution_str` and `ground_truth` (verl's `compute_score`), called as verl's default reward
  manager calls it: `fn(data_source=, solution_str=, ground_truth=, extra_info=)` with `data_source` the row's
  column (else the domain's name), `solution_str` the final answer text, `ground_truth` the row's
  `ground_truth`, else its `reward_model.ground_truth`, else its `answer` (as the file holds it, not cut at
  `####`), else the env's reference answer, and `extra_info` the row's `extra_info` plus `num_turns`. It
  returns a number, or a dict whose `"score"` is the reward (its other keys become the score's details).
- `trl` — a parameter `completions` (TRL's `GRPOTrainer` reward functions), called with lists, one entry per
  trajectory: `prompts` (the row's chat, or the first prompt's text), `completions` (the final answer: text,
  or `[{"role": "assistant", "content": text}]` for a chat row), `completion_ids` (the last turn's token ids;
  empty on remote backends, which carry no tokens), every column of the row by its name (as TRL passes the
  dataset's columns; roles by their names too), `trainer_state` (a `transformers.TrainerState` at the
  trajectories' policy version, `max_steps` = `train.steps`), `log_extra` and `log_metric` (their values land
  in the score's details). It returns one value per completion; `None` marks one it cannot score (TRL leaves
  it out of the group baseline; here the trajectory ends FAILED as unscorable — not a fault — and is replaced).
- `row` — parameters `response` and `row`: `fn(response=<final answer>, row=<the dataset row>)`.
- `trajectory` — one positional parameter: `fn(trajectory)` (rollart's own; see protocol.py).
A function with none of these is refused before anything starts (`RewardShapeError`, exit 2). Only the
keyword arguments a function declares are passed, unless it takes `**kwargs` (then all of its shape's).
"""

from __future__ import annotations

import inspect
import numbers
from dataclasses import dataclass
from typing import Any, Awaitable, Callable, Mapping, Sequence

from rollart.reward.protocol import RewardInputError, RewardOutput, final_action
from rollart.types import Trajectory

SHAPES = ("verl", "trl", "row", "trajectory")
ACCEPTED = (
    "f(trajectory) — rollart's own (a Trajectory); f(response, row) — the final answer and the dataset row; "
    "TRL's f(completions, **kwargs) -> list[float] (prompts, completions, completion_ids and the row's columns by "
    "name); verl's compute_score(data_source, solution_str, ground_truth, extra_info) -> float | {'score': ...}"
)
TRL_ARGUMENTS = ("prompts", "completions", "completion_ids", "trainer_state", "log_extra", "log_metric")
TRL_NOT_COLUMNS = ("prompt", "completion", "completion_ids")  # TRL passes these columns as its own arguments
VERL_ARGUMENTS = ("data_source", "solution_str", "ground_truth", "extra_info")


class RewardShapeError(ValueError):
    """A reward function whose parameters fit none of the shapes rollart calls."""


class Unscorable(RewardInputError):
    """A reward function said it cannot score this trajectory (TRL's `None`): not a fault, nothing to retry."""


@dataclass(frozen=True)
class Shape:
    """How a reward function is called: its kind (one of `SHAPES`), the keyword parameters it declares, whether it
    takes `**kwargs`, and for TRL the parameters only a dataset row's columns can fill."""

    kind: str
    names: tuple[str, ...]
    var_kw: bool = False
    required: tuple[str, ...] = ()  # the keyword parameters without a default

    @property
    def columns(self) -> tuple[str, ...]:
        """TRL: the row columns the function asks for by name (required or not)."""
        return tuple(n for n in self.names if n not in TRL_ARGUMENTS) if self.kind == "trl" else ()

    @property
    def required_columns(self) -> tuple[str, ...]:
        """TRL: the row columns without which the function cannot be called."""
        return tuple(n for n in self.columns if n in self.required)

    def passes(self, name: str) -> bool:
        return self.var_kw or name in self.names


def signature_of(fn: Any) -> inspect.Signature:
    """The signature a call of `fn` sees (a class: its instances' `__call__`, without `self`)."""
    if inspect.isclass(fn):
        call = inspect.signature(fn.__call__)
        return call.replace(parameters=list(call.parameters.values())[1:])
    return inspect.signature(fn)


def shape_of(fn: Any, spec: str = "") -> Shape:
    """The shape of `fn` (see the module docstring); `RewardShapeError` when it has none."""
    name = spec or getattr(fn, "__name__", type(fn).__name__)
    try:
        sig = signature_of(fn)
    except (TypeError, ValueError) as exc:
        raise RewardShapeError(f"reward fn {name}: its signature cannot be read ({exc}); rollart calls these "
                               f"shapes: {ACCEPTED}") from None
    params = list(sig.parameters.values())
    keyword = tuple(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY))
    var_kw = any(p.kind is p.VAR_KEYWORD for p in params)
    if {"solution_str", "ground_truth"} <= set(keyword):
        kind = "verl"
    elif "completions" in keyword:
        kind = "trl"
    elif {"response", "row"} <= set(keyword):
        kind = "row"
    elif _one_positional(params):
        kind = "trajectory"
    else:
        raise RewardShapeError(f"reward fn {name}{sig} fits none of the shapes rollart calls: {ACCEPTED}")
    required = [p.name for p in params if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    shape = Shape(kind, keyword, var_kw, tuple(required))
    known = {"verl": VERL_ARGUMENTS, "row": ("response", "row")}.get(kind)
    if known is not None and (extra := [n for n in required if n not in known]):
        raise RewardShapeError(f"reward fn {name}{sig} looks like the {kind} shape but also requires {extra}, "
                               f"which that shape never passes: {ACCEPTED}")
    return shape


def _one_positional(params: Sequence[inspect.Parameter]) -> bool:
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL)]
    required = [p for p in params if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
    return bool(positional) and len(required) <= 1 and (not required or required[0] is positional[0])


def _row(trajectory: Trajectory) -> Mapping[str, Any]:
    row = trajectory.reference.get("row")
    return row if isinstance(row, Mapping) else {}


def _chat(trajectory: Trajectory) -> list[Any] | None:
    messages = _row(trajectory).get("messages")
    return list(messages) if isinstance(messages, list) else None


class ShapedReward:
    """A user reward function of any shape, called as a reward of one trajectory (and TRL's per group)."""

    def __init__(self, fn: Callable[..., Any], shape: Shape, name: str, max_steps: int = 0) -> None:
        self.fn, self.shape, self.__name__, self.max_steps = fn, shape, name, max_steps
        self.batched = shape.kind == "trl"
        self.is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))

    def __call__(self, trajectory: Trajectory) -> Any:
        """The score of one trajectory: a value, or an awaitable of one for an async function."""
        if self.batched:
            value, details = self._trl([trajectory])
            return self._then(value, lambda values: unwrap(self._one(values, details)[0]))
        if self.shape.kind == "trajectory":
            return self.fn(trajectory)
        if self.shape.kind == "row":
            if "row" not in trajectory.reference:
                raise RewardInputError(f"reward fn {self.__name__} takes a dataset row, but trajectory "
                                       f"{trajectory.trajectory_id} carries none (is its domain `env: dataset`?)")
            return self.fn(response=final_action(trajectory), row=dict(_row(trajectory)))
        return self._then(self.fn(**self._verl(trajectory)), _verl_output)

    async def score_batch(self, trajectories: Sequence[Trajectory]) -> list[RewardOutput | Unscorable]:
        """TRL's shape: one call for the whole group; per trajectory its output, or `Unscorable` for a None.
        A raise or a wrong answer (not a list, wrong length, a non-number) raises for the whole group."""
        value, details = self._trl(trajectories)
        if inspect.isawaitable(value):
            value = await value
        return self._one(value, details)

    # --- verl -----------------------------------------------------------------------------------------
    def _verl(self, trajectory: Trajectory) -> dict[str, Any]:
        row = _row(trajectory)
        truth = _ground_truth(trajectory, row)
        extra = row.get("extra_info")
        arguments = {"data_source": row.get("data_source") or trajectory.domain,
                     "solution_str": final_action(trajectory), "ground_truth": truth,
                     "extra_info": {**(dict(extra) if isinstance(extra, Mapping) else {}),
                                    "num_turns": len(trajectory.turns)}}
        return {k: v for k, v in arguments.items() if self.shape.passes(k)}

    # --- TRL ------------------------------------------------------------------------------------------
    def _trl(self, trajectories: Sequence[Trajectory]) -> tuple[Any, list[dict[str, Any]]]:
        """The call (its value, or an awaitable of it) and the details `log_extra`/`log_metric` fill, per
        trajectory."""
        from transformers import TrainerState

        details: list[dict[str, Any]] = [{} for _ in trajectories]

        def log_extra(column: str, values: list[Any]) -> None:
            for mine, value in zip(details, values):
                mine[str(column)] = value

        def log_metric(name: str, value: float) -> None:
            for mine in details:
                mine[f"metric/{name}"] = value

        rows = [_row(t) for t in trajectories]
        chats = [_chat(t) for t in trajectories]
        texts = [final_action(t) for t in trajectories]
        arguments: dict[str, Any] = {
            "prompts": [chat if chat is not None else str(t.reference.get("question") or
                                                          (t.turns[0].observation if t.turns else ""))
                        for t, chat in zip(trajectories, chats)],
            "completions": [[{"role": "assistant", "content": text}] if chat is not None else text
                            for text, chat in zip(texts, chats)],
            "completion_ids": [list(t.turns[-1].response_token_ids) if t.turns else [] for t in trajectories],
            "trainer_state": TrainerState(global_step=min(t.start_version for t in trajectories),
                                          max_steps=self.max_steps),
            "log_extra": log_extra,
            "log_metric": log_metric,
        }
        names = dict.fromkeys(k for row in rows for k in row)
        for column in names:
            if column not in TRL_NOT_COLUMNS and column not in arguments:
                arguments[column] = [row.get(column) for row in rows]
        missing = [n for n in self.shape.columns if n not in arguments]
        if missing:
            raise RewardInputError(f"reward fn {self.__name__} asks for {missing}, which trajectory "
                                   f"{trajectories[0].trajectory_id}'s row does not carry (its columns: {list(names)})")
        return self.fn(**{k: v for k, v in arguments.items() if self.shape.passes(k)}), details

    def _one(self, values: Any, details: list[dict[str, Any]]) -> list[RewardOutput | Unscorable]:
        """TRL's answer checked: a list of one number (or None) per completion."""
        n = len(details)
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise TypeError(f"reward fn {self.__name__} returned {type(values).__name__}; a TRL reward function "
                            f"returns a list with one reward per completion")
        if len(values) != n:
            raise ValueError(f"reward fn {self.__name__} returned {len(values)} rewards for {n} completions (one per "
                             "completion)")
        out: list[RewardOutput | Unscorable] = []
        for value, mine in zip(values, details):
            if value is None:
                out.append(Unscorable(f"reward fn {self.__name__} returned None: it cannot score this completion"))
            elif isinstance(value, numbers.Real):  # numpy's scalars too
                out.append(RewardOutput(float(value), details=mine))
            else:
                raise TypeError(f"reward fn {self.__name__} returned {type(value).__name__} {value!r:.60} in its "
                                "list; expected numbers (or None)")
        return out

    @staticmethod
    def _then(value: Any, after: Callable[[Any], Any]) -> Any:
        if inspect.isawaitable(value):
            async def finish(awaited: Awaitable[Any]) -> Any:
                return after(await awaited)

            return finish(value)
        return after(value)


def _ground_truth(trajectory: Trajectory, row: Mapping[str, Any]) -> Any:
    if row.get("ground_truth") is not None:
        return row["ground_truth"]
    model = row.get("reward_model")
    if isinstance(model, Mapping) and model.get("ground_truth") is not None:
        return model["ground_truth"]
    for value in (row.get("answer"), trajectory.reference.get("answer")):
        if value is not None:
            return value
    raise RewardInputError(f"trajectory {trajectory.trajectory_id} has no ground truth for a verl compute_score: "
                           "its row has no ground_truth, reward_model.ground_truth or answer, and its env no "
                           f"reference answer ({trajectory.reference.get('source', 'not a dataset row')})")


def _verl_output(value: Any) -> Any:
    if isinstance(value, Mapping):
        if "score" not in value:
            raise TypeError(f"a verl compute_score returned a dict without 'score' (keys: {sorted(value)})")
        details = {str(k): v for k, v in value.items() if k != "score"}
        score = value["score"]
        if not isinstance(score, numbers.Real):
            raise TypeError(f"a verl compute_score returned score {score!r:.60}, not a number")
        return RewardOutput(float(score), details=details)
    return float(value) if isinstance(value, numbers.Real) else value  # (numpy scalars; anything else: refused)


def unwrap(output: RewardOutput | Unscorable) -> RewardOutput:
    """A per-trajectory output of `score_batch`, raising its `Unscorable`."""
    if isinstance(output, Unscorable):
        raise output
    return output
