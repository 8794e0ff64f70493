"""The run-directory contract: where every artefact of a training run lives, named once, and how rollart
writes there without ever following a symbolic link.

In: a run directory path. Out: `RunPaths`, the one place these file names are spelled:

    RUN_DIR/config.yaml        resolved config (`config.loader.write_resolved`)
    RUN_DIR/metrics.jsonl      one JSON object per log call: {"step", "wall_s", "time", "<ns>/<name>": number}
    RUN_DIR/samples.jsonl      a few trained trajectories per domain and step, as text (`observability.samples`)
    RUN_DIR/timeline.json      Chrome trace of every trajectory's life (opens in Perfetto)
    RUN_DIR/ledger.jsonl       every trajectory's moves, one JSON object each: {"time", "id", "group", "domain",
                               "fate": running|ready|trained|aborted|failed|stale, "reason", "digest", "batch"}
    RUN_DIR/summary.json       {eval_first, eval_last, eval_first_by_domain, eval_last_by_domain, steps, wall_s, ...}
    RUN_DIR/tensorboard/       TensorBoard event files
    RUN_DIR/checkpoints/       trainer checkpoints (their own layout: `rollart.trainer.checkpoint`)
    RUN_DIR/report/index.html  `rollart report RUN_DIR`

A run directory is data that may come from anyone (copied from a shared disk, unpacked from an archive),
so nothing in it may redirect what rollart writes or reads. `write_file`, `open_file`, `read_text` and
`make_dir` open every directory between the run directory and the file, and the file itself, with
`O_NOFOLLOW` (relative to the directory above, so nothing can be swapped in between): a symbolic link
anywhere below the run directory is refused with `UnsafeRunDir` naming it and where it points, a file
with other hard links is refused before it is changed in place, and `write_file` replaces a file
atomically (a fresh temporary file, then a rename), so a reader never sees half of it. The run directory
itself is the user's own path: a link there (e.g. `runs/ -> /data/runs`) is followed, as the user asked.

Why here and not in the observability plane, which writes most of these: the trainer (checkpoints), the
config loader (config.yaml) and the commands read or write them too, and a plane may not import another
plane, nor the config loader any plane. A module at the bottom of the import layers (beside `types`,
importing nothing of rollart) is one that every one of them may import.
"""

from __future__ import annotations

import errno
import os
import stat
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterator


class UnsafeRunDir(ValueError):
    """A path inside a run directory that rollart will not write or read through: a symbolic link, a hard
    link to another file, or something else than the file or directory expected."""


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @classmethod
    def of(cls, run_dir: str | Path) -> RunPaths:
        return cls(Path(run_dir))

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def samples(self) -> Path:
        return self.root / "samples.jsonl"

    @property
    def timeline(self) -> Path:
        return self.root / "timeline.json"

    @property
    def summary(self) -> Path:
        return self.root / "summary.json"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def report_dir(self) -> Path:
        return self.root / "report"

    @property
    def report(self) -> Path:
        return self.report_dir / "index.html"

    # every write and read of rollart below the run directory goes through these (see the module docstring)
    def write(self, path: Path, data: str | bytes) -> Path:
        return write_file(path, data, root=self.root)

    def open(self, path: Path, mode: str = "r") -> IO[Any]:
        return open_file(path, mode, root=self.root)

    def read_text(self, path: Path) -> str:
        return read_text(path, root=self.root)

    def make_dir(self, path: Path) -> Path:
        return make_dir(path, root=self.root)

    def artefacts(self) -> list[Path]:
        """Every path rollart writes directly below the run directory (what `unsafe_paths` checks)."""
        return [self.config, self.metrics, self.ledger, self.timeline, self.summary, self.tensorboard,
                self.checkpoints, self.report_dir]

    def unsafe_paths(self) -> list[str]:
        """What in this run directory rollart would refuse to write through — symbolic links (and hard
        links) at its artefacts, anywhere in the directories it writes into (tensorboard/, checkpoints/,
        report/) — each as a sentence naming it; nothing is followed, nothing changed."""
        problems: list[str] = []
        for path in self.artefacts():
            if not os.path.lexists(path):
                continue
            if why := _link_problem(path):
                problems.append(why)
            elif path.is_dir():
                for directory, dirs, files in os.walk(path, followlinks=False):
                    for name in sorted(dirs + files):
                        if why := _link_problem(Path(directory) / name):
                            problems.append(why)
        return problems


# --- writing and reading without following links ------------------------------------------------------

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_MODES = {  # open() mode → os.open flags (binary or text is fdopen's business)
    "r": os.O_RDONLY, "w": os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "a": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
    "r+": os.O_RDWR, "a+": os.O_RDWR | os.O_CREAT | os.O_APPEND,
}


def _link_problem(path: Path) -> str:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return ""
    if stat.S_ISLNK(st.st_mode):
        return (f"{path} is a symbolic link (to {os.readlink(path)}): rollart never writes one and will not "
                "write or read through it")
    if stat.S_ISREG(st.st_mode) and st.st_nlink > 1:
        return f"{path} has {st.st_nlink - 1} other hard link(s): writing it would change another file too"
    return ""


def _refuse(path: Path, exc: OSError) -> UnsafeRunDir:
    why = _link_problem(path) or f"{path} cannot be opened safely ({exc.strerror or exc})"
    return UnsafeRunDir(f"{why}. Remove it, or give another run_dir")


@contextmanager
def _directory(directory: Path, root: Path | None, create: bool) -> Iterator[int]:
    """A file descriptor of `directory`, reached from `root` (default: `directory` itself, the user's path)
    one name at a time with O_NOFOLLOW, creating what is missing when `create`."""
    start = Path(root) if root is not None else directory
    try:
        parts = [p for p in directory.relative_to(start).parts if p not in ("", ".")]
    except ValueError:
        raise ValueError(f"{directory} is not inside {start}") from None
    if create:
        start.mkdir(parents=True, exist_ok=True)  # the run directory itself: the user's path
    fd = os.open(start, os.O_RDONLY | _O_DIRECTORY | _O_CLOEXEC)
    here = start
    try:
        for part in parts:
            here = here / part
            if create:
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)  # never follows a link at `part` (EEXIST)
                except FileExistsError:
                    pass
            try:
                sub = os.open(part, os.O_RDONLY | _O_DIRECTORY | _O_NOFOLLOW | _O_CLOEXEC, dir_fd=fd)
            except FileNotFoundError:
                raise  # reading where nothing was written: the caller's error to handle
            except OSError as exc:  # ELOOP: a link; ENOTDIR: not a directory
                raise _refuse(here, exc) from None
            os.close(fd)
            fd = sub
        yield fd
    finally:
        os.close(fd)


def make_dir(path: str | Path, *, root: str | Path | None = None) -> Path:
    """`mkdir -p path` below `root` (default: `path`'s parent), refusing a symbolic link on the way or at
    `path`; returns `path`."""
    path = Path(path)
    with _directory(path, Path(root) if root is not None else path.parent, create=True):
        pass
    return path


def open_file(path: str | Path, mode: str = "r", *, root: str | Path | None = None,
              encoding: str | None = None) -> IO[Any]:
    """`open(path, mode)` for a file below `root` (default: its own directory) that refuses a symbolic
    link at the file or on the way (and, for a mode that changes the file in place, a file with other
    hard links). Modes: r, w, a, r+, a+, each with b for bytes."""
    path = Path(path)
    base = mode.replace("b", "")
    if base not in _MODES:
        raise ValueError(f"open_file: mode {mode!r} is not one of {sorted(_MODES)} (+ b)")
    flags = _MODES[base] | _O_NOFOLLOW | _O_CLOEXEC
    with _directory(path.parent, Path(root) if root is not None else None, create=base != "r") as dir_fd:
        try:
            fd = os.open(path.name, flags, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise
            raise _refuse(path, exc) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeRunDir(f"{path} is not a regular file. Remove it, or give another run_dir")
        if base != "r" and st.st_nlink > 1:
            raise UnsafeRunDir(f"{path} has {st.st_nlink - 1} other hard link(s): writing it would change "
                               "another file too. Remove it, or give another run_dir")
        return os.fdopen(fd, mode, encoding=None if "b" in mode else (encoding or "utf-8"))
    except BaseException:
        os.close(fd)
        raise


def read_text(path: str | Path, *, root: str | Path | None = None) -> str:
    """The text of a file below `root`, read without following a link (see `open_file`)."""
    with open_file(path, "r", root=root) as f:
        return f.read()


def write_file(path: str | Path, data: str | bytes, *, root: str | Path | None = None) -> Path:
    """Replace `path` (below `root`, default its own directory) with `data`, atomically: a fresh temporary
    file beside it (O_EXCL, O_NOFOLLOW), then a rename over it — a link at `path` is replaced, never
    followed; a link on the way is refused."""
    path = Path(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    with _directory(path.parent, Path(root) if root is not None else None, create=True) as dir_fd:
        tmp = f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(payload)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
            raise
    return path
