"""Token sequences that cost O(1) memory: what the twin puts in the production records.

In the twin, a trajectory of 30,000 tokens must not hold 30,000 Python ints three times over (ids,
logprobs, versions) while 10,000 of them run. `Runs` is an immutable `Sequence` stored as runs of one
repeated value — `Runs.of(0, n)` for n token ids, `Runs.of(v, n)` for n tokens generated at version v,
and `+` for a turn whose tokens span a weight update. `len`, indexing, iteration, `min` and equality
behave as on the tuple it stands for, so `Turn`, `Trajectory`, the staleness policy and the buffer work
on it unchanged. What the records keep (a turn's prompt, token ids, logprobs, versions) is `Runs.shared`:
one object per distinct (value, count) — the counts repeat (a few thousand lengths), so the turns of
100,000 live trajectories add no objects of their own for their tokens (45% of the twin's live memory before).
"""

from __future__ import annotations

from bisect import bisect_right
from itertools import accumulate, repeat
from typing import Any, Iterator, Sequence, overload

SHARED_MAX = 1 << 16  # distinct shared sequences kept; past it the table starts afresh (sharing, not meaning, is lost)
_shared: dict[tuple[type, Any, int], Runs] = {}


class Runs(Sequence[Any]):
    __slots__ = ("_runs", "_ends", "_len")

    def __init__(self, runs: tuple[tuple[Any, int], ...] = ()) -> None:
        self._runs = tuple((v, n) for v, n in runs if n > 0)
        self._ends = tuple(accumulate(n for _, n in self._runs))
        self._len = self._ends[-1] if self._ends else 0

    @classmethod
    def of(cls, value: Any, count: int) -> Runs:
        runs = cls.__new__(cls)  # the common case, without the general constructor's passes
        runs._runs, runs._ends = (((value, count),), (count,)) if count > 0 else ((), ())
        runs._len = max(count, 0)
        return runs

    @classmethod
    def shared(cls, value: Any, count: int) -> Runs:
        """`Runs.of(value, count)`, the same object for the same value (and type: 0 and 0.0 differ) and count
        (immutable: only `is` can tell)."""
        key = (value.__class__, value, count)
        runs = _shared.get(key)
        if runs is None:
            if len(_shared) >= SHARED_MAX:
                _shared.clear()
            runs = _shared[key] = cls.of(value, count)
        return runs

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, index: int) -> Any: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Any, ...]: ...

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            return tuple(self)[index]
        n = len(self)
        if index < 0:
            index += n
        if not 0 <= index < n:
            raise IndexError("Runs index out of range")
        return self._runs[bisect_right(self._ends, index)][0]

    def __iter__(self) -> Iterator[Any]:
        for value, count in self._runs:
            yield from repeat(value, count)

    def __add__(self, other: Runs) -> Runs:
        return Runs(self._runs + other._runs)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Runs):
            return self._runs == other._runs
        return isinstance(other, Sequence) and tuple(self) == tuple(other)

    def __hash__(self) -> int:
        return hash(self._runs)

    def __repr__(self) -> str:
        return f"Runs({list(self._runs)})"

    def values(self) -> tuple[Any, ...]:
        """The distinct run values, in order (e.g. the versions a turn was generated under)."""
        return tuple(v for v, _ in self._runs)
