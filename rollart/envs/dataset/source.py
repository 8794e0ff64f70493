"""Read one split of a dataset domain's rows as a `datasets.Dataset` (Arrow, memory-mapped).

In: where the rows are (`data.train` or `data.validation`: a file, a `save_to_disk` directory or a hub id),
`data.format`, the split and subset for hub ids and dataset dicts, and the mapped columns (each a column or a
dotted path into nested columns, columns.py). Out: a `Table` — the `datasets.Dataset` restricted to the
columns a row can carry (every column of plain type: the mapped ones and the rest, which reach a reward
function that asks for them by name, as TRL and verl hand a whole row over), and where it came from.

Why the `datasets` library: it reads every format users bring (JSONL, Parquet, CSV, Arrow, `save_to_disk`,
the hub) into Arrow files it memory-maps, and caches the conversion, so a 100,000-row file costs pages of a
mapped file, not Python objects, and the second process that opens it pays nothing.

Errors (`DataError`) name the file and what would be valid: a missing file, an unknown format, a JSONL line
that does not parse (by its row number), a column the map names that the file lacks (with the columns it
has) or a path into a field no row has (with the fields there are), a mapped column of a type rows cannot carry
(binary, images; such a column that is not mapped is left out of the rows), an empty split, and a hub id that is
neither cached nor reachable offline. `data.format: verl` reads the file by its extension (verl's files are
Parquet); its column map is the config's (config/domains.py).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from rollart.envs.dataset.columns import feature_problem, split_path

log = logging.getLogger("rollart.data")

EXTENSIONS = {".jsonl": "json", ".json": "json", ".ndjson": "json", ".parquet": "parquet", ".pq": "parquet",
              ".csv": "csv", ".arrow": "arrow"}
FORMATS = ("json", "parquet", "csv", "arrow", "disk", "hub")
LAYOUTS = ("verl",)  # a known layout of columns, in a file whose format its extension says
# Arrow types a row's value may have: text, numbers, booleans, and lists/structs of them (what JSON can carry
# to a reward service); binary, images, audio and timestamps cannot be mapped.
_PLAIN_DTYPES = {"string", "large_string", "bool", "null"} | {f"{k}{n}" for k in ("int", "uint") for n in (8, 16, 32, 64)} \
    | {"float16", "float32", "float64"}


class DataError(ValueError):
    """A dataset that cannot be read as configured; names the file (and the row and column where known)."""


@dataclass(frozen=True)
class Table:
    """One split's rows: `dataset` holds only the mapped columns (in their file's order); `where` says where they
    came from (a path, or `hub id [subset] split`) for messages that name a row."""

    dataset: Any  # a datasets.Dataset
    where: str

    def __len__(self) -> int:
        return len(self.dataset)


def detect_format(location: str, declared: str = "auto") -> str:
    """The format of `location`: `declared` unless auto (or a layout such as verl); else by extension, a directory
    is `disk`, and a name that is neither an existing path nor has a known extension is a hub id."""
    if declared not in ("auto", *LAYOUTS):
        return declared
    path = Path(location).expanduser()
    if path.is_dir():
        return "disk"
    suffix = path.suffix.lower()
    if suffix in EXTENSIONS:
        return EXTENSIONS[suffix]
    if path.exists():
        raise DataError(f"{location}: unknown format {suffix or '(no extension)'!r}; name a file ending in "
                        f"{', '.join(EXTENSIONS)}, a save_to_disk directory, or set data.format to one of {FORMATS}")
    if _looks_like_hub_id(location):
        return "hub"
    raise DataError(f"{location}: no such file or directory (and not a hub dataset id such as 'openai/gsm8k')")


def _looks_like_hub_id(location: str) -> bool:
    parts = location.split("/")
    return 1 <= len(parts) <= 2 and all(p and not p.startswith(".") and p.replace("-", "").replace("_", "")
                                        .replace(".", "").isalnum() for p in parts)


def _quiet_datasets() -> Any:
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity(logging.CRITICAL)  # its errors reach the user as a DataError instead
    return datasets


def load_table(location: str, fmt: str, columns: Mapping[str, str], *, split: str = "train",
               subset: str = "") -> Table:
    """The rows at `location` restricted to the columns a row carries; `columns` (role → column or path) must
    all be there."""
    fmt = detect_format(location, fmt)
    datasets = _quiet_datasets()
    path = Path(location).expanduser()
    if fmt != "hub" and not path.exists():
        raise DataError(f"{location}: no such file or directory")
    where = location if fmt != "hub" else f"{location}{' ' + subset if subset else ''} split {split!r}"
    if _holds_no_rows(path, fmt):
        raise DataError(f"{where}: no rows (an empty split)")
    try:
        if fmt == "json":
            dataset = _read_json(datasets, path)
        elif fmt == "parquet":
            dataset = datasets.Dataset.from_parquet(str(path))
        elif fmt == "csv":
            dataset = datasets.Dataset.from_csv(str(path))
        elif fmt == "arrow":
            dataset = _read_arrow(datasets, path)
        elif fmt == "disk":
            dataset = _read_disk(datasets, path, split)
        elif fmt == "hub":
            dataset = _read_hub(datasets, location, subset, split)
        else:
            raise DataError(f"{location}: unknown data.format {fmt!r}; one of auto, {', '.join(FORMATS)}")
    except DataError:
        raise
    except Exception as exc:  # noqa: BLE001 — the library's own error, said with the file it is about
        raise DataError(f"{where}: cannot be read as {fmt}: {type(exc).__name__}: {exc}") from exc
    return Table(_select(dataset, columns, where), where)


def _holds_no_rows(path: Path, fmt: str) -> bool:
    """An empty JSONL or Parquet file (the library fails on them with a message that does not say so)."""
    if fmt == "parquet":
        import pyarrow.parquet as pq

        try:
            return pq.ParquetFile(str(path)).metadata.num_rows == 0
        except Exception:  # noqa: BLE001 — not Parquet at all: the reader says so below
            return False
    if fmt == "json" and path.suffix.lower() != ".json":
        with path.open("rb") as f:
            return not any(line.strip() for line in f)
    return False


def _read_json(datasets: Any, path: Path) -> Any:
    try:
        return datasets.Dataset.from_json(str(path))
    except Exception as exc:  # noqa: BLE001 — find the line that does not parse, to name it
        bad = _first_bad_json_line(path)
        if bad:
            raise DataError(f"{path} {bad}") from exc
        raise


def _first_bad_json_line(path: Path) -> str:
    """'row N: ...' for the first line of a JSONL file that is not a JSON object, else ''."""
    if path.suffix.lower() == ".json":
        try:
            json.loads(path.read_text())
            return ""
        except ValueError as exc:
            return f"is not valid JSON: {exc}"
    with path.open("rb") as f:
        row = 0
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                value = json.loads(line)
            except ValueError as exc:
                return f"row {row} (line {number}): not valid JSON: {exc}"
            if not isinstance(value, dict):
                return f"row {row} (line {number}): a JSON {type(value).__name__}, not an object of columns"
            row += 1
    return ""


def _read_arrow(datasets: Any, path: Path) -> Any:
    try:
        return datasets.Dataset.from_file(str(path))  # the stream format datasets writes: memory-mapped
    except Exception:  # noqa: BLE001 — an Arrow IPC *file* (pyarrow.feather / ipc.new_file) instead
        import pyarrow as pa
        from datasets.table import InMemoryTable

        table = pa.ipc.open_file(pa.memory_map(str(path))).read_all()  # zero-copy over the mapped file
        return datasets.Dataset(InMemoryTable(table))


def _read_disk(datasets: Any, path: Path, split: str) -> Any:
    loaded = datasets.load_from_disk(str(path))
    if isinstance(loaded, datasets.DatasetDict):
        if split not in loaded:
            raise DataError(f"{path}: a dataset dict without split {split!r} (it has {sorted(loaded)}); set "
                            "data.train_split / data.validation_split")
        return loaded[split]
    return loaded


def _read_hub(datasets: Any, dataset_id: str, subset: str, split: str) -> Any:
    try:
        return datasets.load_dataset(dataset_id, subset or None, split=split)
    except Exception as exc:  # noqa: BLE001
        offline = [v for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE") if os.environ.get(v, "") not in ("", "0")]
        hint = (f" ({' and '.join(offline)} set: only datasets already in the cache "
                f"{datasets.config.HF_DATASETS_CACHE} can be read; unset it to download)") if offline else ""
        raise DataError(f"hub dataset {dataset_id!r}{' subset ' + repr(subset) if subset else ''} split {split!r} "
                        f"cannot be loaded{hint}: {type(exc).__name__}: {exc}") from exc


def _select(dataset: Any, columns: Mapping[str, str], where: str) -> Any:
    have = list(dataset.column_names)
    problems = {path: feature_problem(path, dataset.features) for path in dict.fromkeys(columns.values())}
    missing = sorted(path for path, problem in problems.items() if problem)
    if missing:
        said = "; ".join(problems[path] for path in missing)
        raise DataError(f"{where}: {said} (data.columns maps {_roles_of(columns, missing)}); its columns are {have}")
    mapped = {split_path(path, have)[0] for path in columns.values()}  # type: ignore[index]
    for column in sorted(mapped):
        if not _plain(dataset.features[column]):
            raise DataError(f"{where}: column {column!r} has type {dataset.features[column]}, which a row cannot "
                            "carry (text, numbers, booleans and lists or structs of them can be mapped)")
    if not len(dataset):
        raise DataError(f"{where}: no rows (an empty split)")
    return dataset.select_columns([c for c in have if c in mapped or _plain(dataset.features[c])])


def _roles_of(columns: Mapping[str, str], names: list[str]) -> str:
    return ", ".join(f"{role}: {column}" for role, column in columns.items() if column in names)


def _plain(feature: Any) -> bool:
    """Whether a datasets feature holds only JSON-able values (see `_PLAIN_DTYPES`)."""
    from datasets import Value

    if isinstance(feature, Value):
        return feature.dtype in _PLAIN_DTYPES
    if type(feature).__name__ == "Json":  # objects of varying keys, kept as JSON text and decoded on read
        return True
    if isinstance(feature, dict):
        return all(_plain(f) for f in feature.values())
    if isinstance(feature, (list, tuple)):
        return all(_plain(f) for f in feature)
    inner = getattr(feature, "feature", None)  # List, LargeList, Sequence
    return inner is not None and _plain(inner)
