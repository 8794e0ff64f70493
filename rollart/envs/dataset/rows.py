"""A dataset domain's rows after filtering: which rows train, which validate, and in what order.

In: the domain's `DatasetConfig`, its tables (source.py), the roles its reward and episode need, a
`PromptMeter` (the model's chat template: how many tokens a row's first prompt takes) and its budget, and
the run seed. Out: `DatasetRows` — `draw(ordinal)` gives the training row of a group's ordinal and the epoch
it falls in; `validation_row(i)`; `report()` says what was kept, held out and dropped.

Filters (vectorised over the Arrow columns, so 100,000 rows take milliseconds): a row is dropped, and counted
under its reason with the first few examples (`file row N column C`), when a column its domain needs is null
or empty, when a GSM8K-style answer has nothing after `####`, or when its first prompt — the system prompt,
the user message made by `data.prompt_format` and the template's generation prompt — is longer than the
budget. Lengths: a token covers at least one byte of text, so a prompt whose bytes plus the template's own
tokens fit the budget is kept without tokenising it; only the others are rendered and tokenised exactly.

Guarantees:
- Without `data.validation`, a fixed fraction of train (`holdout`, chosen by `holdout_seed`, before any
  filter) is the validation split, the same in every run, and never trained on.
- Order: ordinal k of a domain's groups falls in epoch e = k // n (n kept training rows) and takes row
  perm_e[k mod n], where perm_e is a permutation seeded by (run seed, e): within an epoch no row repeats, and
  the row of an ordinal is the same in every process and after a resume (the scheduler checkpoints ordinals).
- Row values are JSON-able (NaN and infinities become None), for rewards on remote backends.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence

import numpy as np

from rollart.config import DatasetConfig
from rollart.envs.dataset.columns import arrow_values, row_value
from rollart.envs.dataset.source import DataError, Table

EXAMPLES_PER_REASON = 3
SAFETY_TOKENS = 4  # slack of the byte bound for merges across the template's boundaries


class PromptMeter(Protocol):
    """How many tokens a row's first prompt takes under the model's chat template (see `ChatTokens`)."""

    def overhead(self, messages: int) -> int:
        """Tokens of the template itself around `messages` empty messages, generation prompt included."""

    def count(self, prompts: Sequence[str | Sequence[Mapping[str, Any]]]) -> list[int]:
        """Exact first-prompt tokens of each user message (text) or chat (a list of messages)."""


@dataclass(frozen=True)
class Row:
    """One row: its mapped roles' values, its number in its file (0-based), the file, and every column the row
    carries by its own name (what a reward function may ask for: TRL's and verl's whole row)."""

    values: Mapping[str, Any]
    index: int
    where: str
    columns: Mapping[str, Any] = field(default_factory=dict)

    def reward_row(self) -> dict[str, Any]:
        """What a reward function is given of the row: every column by name, then the roles over them (a role
        named like a column wins: the mapping is the user's word)."""
        return {**self.columns, **self.values}

    def location(self, column: str = "") -> str:
        return f"{self.where} row {self.index}" + (f" column {column!r}" if column else "")


@dataclass
class Drops:
    """Rows dropped, by reason, with the first few of each (`file row N column C: ...`)."""

    counts: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)

    def add(self, reason: str, rows: np.ndarray, example: Callable[[int], str]) -> None:
        """Count the rows at positions `rows` under `reason`; `example(i)` describes row i."""
        if len(rows):
            self.counts[reason] += len(rows)
            kept = self.examples.setdefault(reason, [])
            kept.extend(example(int(i)) for i in rows[: EXAMPLES_PER_REASON - len(kept)])

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def describe(self) -> str:
        if not self.counts:
            return "none dropped"
        return "; ".join(f"{n} {reason} (e.g. {', '.join(self.examples[reason])})"
                         for reason, n in self.counts.most_common())


def format_fields(prompt_format: str) -> list[str]:
    """The roles a `prompt_format` reads (`{tests[0]}` reads `tests`)."""
    names = (f for _, f, _, _ in string.Formatter().parse(prompt_format) if f)
    return list(dict.fromkeys(re.split(r"[.\[]", f, maxsplit=1)[0] for f in names))


def format_prompt(prompt_format: str, values: Mapping[str, Any]) -> str:
    """The user message of a row: `prompt_format` with each role's value (text as it is, a list or object
    indexable: `{tests[0]}`; a missing value is empty)."""
    return prompt_format.format(**{f: "" if values.get(f) is None else values[f] for f in format_fields(prompt_format)})


def final_answer(value: Any) -> str:
    """The reference answer of an answer column's value: the text after the last `####` (GSM8K's
    '... #### 72'), else the whole value, stripped."""
    text = _text(value).strip()
    return text.rsplit("####", 1)[1].strip() if "####" in text else text


def _text(value: Any) -> str:
    return "" if value is None else value if isinstance(value, str) else str(value)


def _json_safe(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


class RowSet:
    """The kept rows of one split: positions into its table, in file order."""

    def __init__(self, table: Table, columns: Mapping[str, str], kept: np.ndarray, drops: Drops) -> None:
        self.table, self.columns, self.kept, self.drops = table, dict(columns), kept, drops

    def __len__(self) -> int:
        return len(self.kept)

    def row(self, i: int) -> Row:
        index = int(self.kept[i])
        record = self.table.dataset[index]
        return Row({role: _json_safe(row_value(record, path)) for role, path in self.columns.items()}, index,
                   self.table.where, {name: _json_safe(value) for name, value in record.items()})


class DatasetRows:
    """A dataset domain's training and validation rows and their order (see the module docstring)."""

    def __init__(self, domain: str, train: RowSet, validation: RowSet, seed: int, held_out: str = "") -> None:
        for name, rows in (("train", train), ("validation", validation)):
            if not len(rows):
                raise DataError(f"domain {domain!r}: no {name} row is left after the filters ({len(rows.table)} "
                                f"read from {rows.table.where}; dropped: {rows.drops.describe()})")
        self.domain, self.train, self.validation, self.seed, self.held_out = domain, train, validation, seed, held_out
        self._perms: dict[int, np.ndarray] = {}

    def permutation(self, epoch: int) -> np.ndarray:
        if epoch not in self._perms:
            if len(self._perms) >= 2:
                self._perms.pop(min(self._perms))
            self._perms[epoch] = np.random.default_rng([self.seed % 2**32, epoch]).permutation(len(self.train))
        return self._perms[epoch]

    def draw(self, ordinal: int) -> tuple[Row, int]:
        """The training row of a group's ordinal (0, 1, 2 … per domain) and its epoch."""
        epoch, position = divmod(int(ordinal), len(self.train))
        return self.train.row(int(self.permutation(epoch)[position])), epoch

    def validation_row(self, i: int) -> Row:
        return self.validation.row(int(i) % len(self.validation))

    def report(self) -> str:
        """One paragraph for the run's log and `rollart data preview`."""
        parts = [f"domain {self.domain!r}: {len(self.train)} training rows from {self.train.table.where} "
                 f"({self.train.drops.describe()})"]
        if self.held_out:
            parts.append(self.held_out)
        parts.append(f"{len(self.validation)} validation rows from {self.validation.table.where} "
                     f"({self.validation.drops.describe()})")
        return "; ".join(parts)


def build_rows(domain: str, data: DatasetConfig, train: Table, validation: Table | None, *, required: Iterable[str],
               meter: PromptMeter, budget: int, seed: int) -> DatasetRows:
    """Filter and split the tables (see the module docstring); `validation` None = hold out part of train."""
    required = [r for r in dict.fromkeys(required) if r in data.columns]
    if validation is None:
        n = len(train)
        if n < 2:
            raise DataError(f"{train.where}: one row, none left to hold out for validation; give data.validation")
        k = max(1, int(round(data.holdout * n)))
        order = np.random.default_rng(data.holdout_seed % 2**32).permutation(n)
        val_positions, train_positions = np.sort(order[:k]), np.sort(order[k:])
        held = (f"no validation file: {k} of {n} train rows ({data.holdout:.0%}, holdout_seed "
                f"{data.holdout_seed}) held out for validation")
        val_table = train
    else:
        train_positions, val_positions, held, val_table = np.arange(len(train)), np.arange(len(validation)), "", validation
    train_rows = filter_rows(train, train_positions, data, required, meter, budget)
    val_rows = filter_rows(val_table, val_positions, data, required, meter, budget)
    return DatasetRows(domain, train_rows, val_rows, seed, held)


def filter_rows(table: Table, positions: np.ndarray, data: DatasetConfig, required: Sequence[str],
                meter: PromptMeter, budget: int) -> RowSet:
    """The rows at `positions` of `table` that pass the filters, and the drops."""
    arrow = _arrow(table.dataset)
    keep = np.zeros(len(table), dtype=bool)
    keep[positions] = True
    drops = Drops()
    for role in required:
        column = data.columns[role]
        empty = _empty(arrow_values(arrow, column)) & keep
        drops.add(f"with column {column!r} ({role}) empty", np.flatnonzero(empty), _at(table, column))
        keep &= ~empty
    if "answer" in required:
        column = data.columns["answer"]
        bare = _nothing_after_hashes(arrow_values(arrow, column)) & keep
        drops.add(f"with nothing after '####' in column {column!r} (answer)", np.flatnonzero(bare), _at(table, column))
        keep &= ~bare
    too_long, lengths = _too_long(table, arrow, keep, data, meter, budget)
    prompt_column = data.columns.get("messages") or data.columns["prompt"]
    drops.add(f"with a first prompt longer than {budget} tokens", np.flatnonzero(too_long),
              lambda i: f"{_at(table, prompt_column)(i)}: {lengths[i]} tokens")
    keep &= ~too_long
    return RowSet(table, data.columns, np.flatnonzero(keep), drops)


def _arrow(dataset: Any) -> Any:
    """The dataset's rows as one pyarrow Table, in the dataset's order."""
    if getattr(dataset, "_indices", None) is not None:
        dataset = dataset.flatten_indices()
    return dataset.data.table


def _at(table: Table, column: str) -> Callable[[int], str]:
    return lambda i: f"{table.where} row {i} column {column!r}"


def _mask(array: Any) -> np.ndarray:
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=bool)


def _empty(column: Any) -> np.ndarray:
    """Null, blank text, or an empty list."""
    import pyarrow as pa
    import pyarrow.compute as pc

    empty = pc.is_null(column)
    kind = column.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind):
        empty = pc.or_(empty, pc.equal(pc.utf8_length(pc.utf8_trim_whitespace(column)), 0))
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        empty = pc.or_(empty, pc.equal(pc.list_value_length(column), 0))
    return _mask(pc.fill_null(empty, True))


def _nothing_after_hashes(column: Any) -> np.ndarray:
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return np.zeros(len(column), dtype=bool)
    tail = pc.utf8_trim_whitespace(pc.replace_substring_regex(column, r"(?s)^.*####", ""))
    bare = pc.and_(pc.match_substring(column, "####"), pc.equal(pc.utf8_length(tail), 0))
    return _mask(pc.fill_null(bare, False))


def _too_long(table: Table, arrow: Any, keep: np.ndarray, data: DatasetConfig, meter: PromptMeter,
              budget: int) -> tuple[np.ndarray, dict[int, int]]:
    """Which kept rows' first prompts exceed `budget` tokens, and the exact lengths of those measured."""
    if "messages" in data.columns:
        content_bytes, messages = _chat_bytes(arrow_values(arrow, data.columns["messages"]))
        bound = content_bytes + messages * (meter.overhead(1) + SAFETY_TOKENS) + meter.overhead(0)
    else:
        fields = format_fields(data.prompt_format)
        literal = sum(len(text.encode()) for text, _, _, _ in string.Formatter().parse(data.prompt_format))
        bound = literal + sum(_text_bytes(arrow_values(arrow, data.columns[f])) for f in fields)
        bound = bound + meter.overhead(1) + SAFETY_TOKENS
    candidates = np.flatnonzero(keep & (bound > budget))
    lengths: dict[int, int] = {}
    too_long = np.zeros(len(keep), dtype=bool)
    for start in range(0, len(candidates), 1024):
        chunk = candidates[start : start + 1024]
        prompts = [_first_prompt(table.dataset[int(i)], data) for i in chunk]
        for i, n in zip(chunk, meter.count(prompts)):
            lengths[int(i)] = n
            too_long[i] = n > budget
    return too_long, lengths


def _first_prompt(record: Mapping[str, Any], data: DatasetConfig) -> str | list[Mapping[str, Any]]:
    values = {role: row_value(record, path) for role, path in data.columns.items()}
    if "messages" in data.columns:
        return list(values["messages"] or [])
    return format_prompt(data.prompt_format, values)


def _text_bytes(column: Any) -> np.ndarray:
    """Bytes of each value as text; a list or object (no text form in Arrow) counts as unbounded, so its rows
    are measured exactly."""
    import pyarrow as pa
    import pyarrow.compute as pc

    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        try:
            column = pc.cast(column, pa.string())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            return np.full(len(column), np.iinfo(np.int64).max // 4, dtype=np.int64)
    return np.asarray(pc.fill_null(pc.binary_length(column), 0).to_numpy(zero_copy_only=False), dtype=np.int64)


def _chat_bytes(column: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the bytes of every message's content, and the number of messages."""
    import pyarrow as pa
    import pyarrow.compute as pc

    column = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    counts = np.asarray(pc.fill_null(pc.list_value_length(column), 0).to_numpy(zero_copy_only=False), dtype=np.int64)
    flat = pc.list_flatten(column)
    parents = np.asarray(pc.list_parent_indices(column).to_numpy(zero_copy_only=False), dtype=np.int64)
    try:
        content = pc.struct_field(flat, "content")
    except (KeyError, pa.ArrowInvalid, pa.ArrowTypeError):
        raise DataError("a messages column must hold lists of {role, content} objects") from None
    sizes = np.asarray(pc.fill_null(pc.binary_length(pc.cast(content, pa.string())), 0).to_numpy(zero_copy_only=False))
    return np.bincount(parents, weights=sizes, minlength=len(counts)).astype(np.int64), counts
