"""Where a role's value is in a row: a column, or a dotted path into nested columns (`reward_model.ground_truth`).

In: the path a `data.columns` entry names and the table's columns (their `datasets` features, an Arrow table or
one decoded row). Out: `split_path` — the column and the fields below it; `feature_problem` — why the path cannot
be read in a table of these features ('' when it can); `arrow_values` — the role's values as one Arrow array per
row (what the vectorised row filters read); `row_value` — the role's value in one decoded row.

Rules: a column named exactly as the path wins (a file someone flattened keeps working: a column literally
called `reward_model.ground_truth`); else the longest leading part of the path that is a column is the column,
and the rest are field names inside it, one per dot — objects (Arrow structs, or datasets' `Json` values) all
the way down. A field a row lacks is null there (the row filters then drop the row if the role is required); a
field no row can have (absent from a struct's type) is a problem `feature_problem` names before anything starts,
with the fields there are. Lists are not indexed by a path (`prompt_format` can: `{tests[0]}`).
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence


def split_path(path: str, columns: Sequence[str]) -> tuple[str, tuple[str, ...]] | None:
    """(column, fields inside it) of `path` among `columns`, or None when no leading part is a column."""
    if path in columns:
        return path, ()
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        head = ".".join(parts[:cut])
        if head in columns:
            return head, tuple(parts[cut:])
    return None


def _is_json(feature: Any) -> bool:
    return type(feature).__name__ == "Json"


def feature_problem(path: str, features: Mapping[str, Any]) -> str:
    """Why `path` names nothing a table with these `datasets` features holds ('' when it does)."""
    found = split_path(path, list(features))
    if found is None:
        return f"no column {path!r}"
    column, fields = found
    feature, walked = features[column], column
    for field in fields:
        if _is_json(feature):
            return ""  # objects of varying keys: a row without the field has null there
        if not isinstance(feature, dict):
            return (f"column path {path!r}: {walked!r} holds {_kind(feature)}, not an object with field {field!r} "
                    "(a path reaches into objects only)")
        if field not in feature:
            return f"column path {path!r}: {walked!r} has no field {field!r} (its fields: {', '.join(feature)})"
        feature, walked = feature[field], f"{walked}.{field}"
    return ""


def _kind(feature: Any) -> str:
    inner = getattr(feature, "feature", None)
    if inner is not None or isinstance(feature, (list, tuple)):
        return "a list"
    return f"a {getattr(feature, 'dtype', type(feature).__name__)}"


def arrow_values(table: Any, path: str) -> Any:
    """The values of `path` in a pyarrow Table (one per row, nulls where a row lacks a field)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    found = split_path(path, table.column_names)
    if found is None:
        raise KeyError(f"no column {path!r}")  # (the table was checked with `feature_problem` when read)
    column, fields = found
    values = table.column(column)
    for i, field in enumerate(fields):
        if pa.types.is_struct(values.type):
            values = pc.struct_field(values, [field])
            continue
        # JSON text (datasets' Json feature): decode once, read the rest of the path per row
        rows = [_walk(_decode(v), fields[i:]) for v in values.to_pylist()]
        try:
            return pa.array(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError):  # mixed kinds: keep what the filters can measure
            return pa.array([None if v is None else v if isinstance(v, str) else json.dumps(v) for v in rows])
    return values


def row_value(record: Mapping[str, Any], path: str) -> Any:
    """The value of `path` in one decoded row (None where the row lacks a field on the way)."""
    found = split_path(path, list(record))
    if found is None:
        return None
    column, fields = found
    return _walk(record[column], fields)


def _decode(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


def _walk(value: Any, fields: Sequence[str]) -> Any:
    for field in fields:
        value = _decode(value)
        if not isinstance(value, Mapping):
            return None
        value = value.get(field)
    return value
