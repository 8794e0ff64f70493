"""The run-directory contract: where every artefact of a training run lives, named once, and the one way
rollart writes and reads there — without ever following a symbolic link.

In: a run directory path. Out: `RunPaths`, the one place these file names are spelled (`ARTEFACTS`):

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
    RUN_DIR/wandb/             W&B's own files, when `observability.wandb_project` is set

A run directory is data that may come from anyone (copied from a shared disk, unpacked from an archive),
so nothing in it may redirect what rollart writes or reads, hang it or exhaust its memory. The one helper
every writer and reader uses is `RunPaths` — `open`, `write`, `read_text`, `lines`, `make_dir` — which:
- takes only the artefacts listed in `ARTEFACTS` (a new file is added there, and with it to the check below
  and to the test that lists a run directory after a run: nothing lands in a run directory unnamed);
- opens every directory between the run directory and the file, and the file itself, with `O_NOFOLLOW`
  (relative to the directory above, so nothing can be swapped in between): a symbolic link anywhere below
  the run directory is refused with `UnsafeRunDir` naming it and where it points; a file with other hard
  links is refused before it is changed in place; a FIFO, socket or device is refused without blocking on it
  (`O_NONBLOCK` until it is known to be a regular file);
- replaces a file atomically (`write`: a fresh temporary file, then a rename), so a reader never sees half
  of it, and reads a file line by line in bounded memory (`lines`: a line over its cap is skipped and said
  so, never held) or whole only up to a size cap (`read_text`).
`unsafe_paths()` lists, before a run starts, everything in the whole run directory rollart would refuse —
every entry, not only the listed ones (inside wandb/ only W&B writes and reads, with links of its own: that
directory itself is checked, not its contents). The run directory itself is the user's own path: a link there (e.g.
`runs/ -> /data/runs`) is followed, as the user asked.

Why here and not in the observability plane, which writes most of these: the trainer (checkpoints), the
config loader (config.yaml) and the commands read or write them too, and a plane may not import another
plane, nor the config loader any plane. A module at the bottom of the import layers (beside `types`,
importing nothing of rollart) is one that every one of them may import.
"""

from __future__ import annotations

import errno
import fcntl
import os
import stat
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Iterable, Iterator

# what may stand directly below a run directory: name → what it is (a name ending in "/" is a directory)
ARTEFACTS: dict[str, str] = {
    "config.yaml": "the resolved config",
    "metrics.jsonl": "metric records, one JSON object per log call",
    "samples.jsonl": "a few trained trajectories per domain and step, as text",
    "timeline.json": "the Chrome trace of every trajectory's life",
    "ledger.jsonl": "every trajectory's moves",
    "summary.json": "the run's summary",
    "tensorboard/": "TensorBoard event files",
    "checkpoints/": "trainer checkpoints",
    "report/": "the HTML report",
    "wandb/": "W&B's own files (observability.wandb_project)",
}
# written by a library with links of its own inside (W&B's `latest-run`): the directory itself is checked, not
# what is in it — rollart neither writes nor reads there
FOREIGN_LAYOUT = ("wandb",)
MAX_LINE_BYTES = 64 * 2**20  # `lines`: a longer line is skipped (a sample record is capped far below it)
MAX_READ_BYTES = 512 * 2**20  # `read_text`: a larger file is refused (timeline.json is capped far below it)


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
    def write(self, path: Path, data: str | bytes | Iterable[bytes]) -> Path:
        """Replace `path` with `data` (text, bytes, or an iterable of byte chunks written as they come),
        atomically, never through a link."""
        return _write_file(self._artefact(path), data, root=self.root)

    def open(self, path: Path, mode: str = "r") -> IO[Any]:
        """`open(path, mode)` without following a link (modes r, w, a, r+, a+, each with b for bytes)."""
        return _open_file(self._artefact(path), mode, root=self.root)

    def read_text(self, path: Path, max_bytes: int = MAX_READ_BYTES) -> str:
        """The whole text of `path` (UTF-8), refused past `max_bytes` (`ValueError` naming the file)."""
        with self.open(path, "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise ValueError(f"{path} is larger than {max_bytes} bytes: not one rollart wrote")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError as exc:
            line = data.count(b"\n", 0, exc.start) + 1
            raise ValueError(f"{path} line {line}: invalid UTF-8 ({exc.reason})") from None

    def lines(self, path: Path, max_line_bytes: int = MAX_LINE_BYTES) -> Iterator[tuple[int, bytes | None]]:
        """(line number from 1, the line's bytes without its newline) for each line of `path`, read in chunks:
        memory stays bounded by `max_line_bytes` whatever the file holds; a longer line comes as None."""
        with self.open(path, "rb") as f:
            yield from split_lines(f, max_line_bytes)

    def make_dir(self, path: Path) -> Path:
        return _make_dir(self._artefact(path), root=self.root)

    def artefacts(self) -> list[Path]:
        """Every path of `ARTEFACTS` in this run directory."""
        return [self.root / name.rstrip("/") for name in ARTEFACTS]

    def _artefact(self, path: Path) -> Path:
        path = Path(path)
        try:
            parts = path.relative_to(self.root).parts
        except ValueError:
            raise ValueError(f"{path} is not inside the run directory {self.root}") from None
        if parts and ((len(parts) == 1 and parts[0] in ARTEFACTS) or parts[0] + "/" in ARTEFACTS):
            return path
        raise ValueError(f"{path} is not an artefact of a run directory: name it in rollart.base.run_dir.ARTEFACTS "
                         "(what the run-directory check inspects and the run-directory listing test expects)")

    def unsafe_paths(self) -> list[str]:
        """Everything in this run directory rollart would refuse to write or read through — symbolic links,
        hard links, and at a file artefact anything but a regular file — each as a sentence naming it; the
        whole tree is inspected, nothing is followed, nothing changed."""
        problems: list[str] = []
        if not self.root.is_dir():
            return problems
        for directory, dirs, files in os.walk(self.root, followlinks=False):
            if directory == str(self.root):
                dirs[:] = [d for d in dirs if d not in FOREIGN_LAYOUT or os.path.islink(self.root / d)]
                names = sorted(set(dirs) | set(files) | {d for d in FOREIGN_LAYOUT if os.path.lexists(self.root / d)})
            else:
                names = sorted(dirs + files)
            for name in names:
                path = Path(directory) / name
                if why := _link_problem(path):
                    problems.append(why)
                elif directory == str(self.root) and name in ARTEFACTS and not path.is_file():
                    problems.append(f"{path} is not a regular file: rollart will not write or read it")
                elif directory == str(self.root) and name + "/" in ARTEFACTS and not path.is_dir():
                    problems.append(f"{path} is not a directory: rollart will not write or read in it")
        return problems


def split_lines(f: IO[bytes], max_line_bytes: int = MAX_LINE_BYTES, chunk_bytes: int = 2**20
                ) -> Iterator[tuple[int, bytes | None]]:
    """The lines of a binary stream as `RunPaths.lines` gives them (a line over `max_line_bytes`: None)."""
    parts: list[bytes] = []
    held = number = 0
    skipping = False
    while chunk := f.read(chunk_bytes):
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            number += 1
            if skipping or held + end - start > max_line_bytes:
                yield number, None
            else:
                yield number, b"".join(parts) + chunk[start:end]
            parts, held, skipping, start = [], 0, False, end + 1
        rest = chunk[start:]
        if not skipping and rest:
            if held + len(rest) > max_line_bytes:
                parts, held, skipping = [], 0, True  # what a line over the cap holds is never kept
            else:
                parts.append(rest)
                held += len(rest)
    if skipping or held:
        yield number + 1, None if skipping else b"".join(parts)


# --- writing and reading without following links ------------------------------------------------------

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_NONBLOCK = getattr(os, "O_NONBLOCK", 0)
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
def _directory(directory: Path, root: Path, create: bool) -> Iterator[int]:
    """A file descriptor of `directory`, reached from `root` (the user's path) one name at a time with
    O_NOFOLLOW, creating what is missing when `create`."""
    start = Path(root)
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


def _make_dir(path: Path, *, root: Path) -> Path:
    """`mkdir -p path` below `root`, refusing a symbolic link on the way or at `path`; returns `path`."""
    with _directory(path, root, create=True):
        pass
    return path


def _open_file(path: Path, mode: str, *, root: Path) -> IO[Any]:
    """`open(path, mode)` for a file below `root` that refuses a symbolic link at the file or on the way, a
    file that is not a regular one (without blocking on a FIFO) and, for a mode that changes the file in
    place, a file with other hard links."""
    base = mode.replace("b", "")
    if base not in _MODES:
        raise ValueError(f"open_file: mode {mode!r} is not one of {sorted(_MODES)} (+ b)")
    flags = _MODES[base] | _O_NOFOLLOW | _O_CLOEXEC | _O_NONBLOCK
    with _directory(path.parent, root, create=base != "r") as dir_fd:
        try:
            fd = os.open(path.name, flags, 0o644, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ENOENT:
                raise
            raise _refuse(path, exc) from None  # ELOOP: a link; ENXIO: a FIFO nobody reads
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise UnsafeRunDir(f"{path} is not a regular file. Remove it, or give another run_dir")
        if base != "r" and st.st_nlink > 1:
            raise UnsafeRunDir(f"{path} has {st.st_nlink - 1} other hard link(s): writing it would change "
                               "another file too. Remove it, or give another run_dir")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~_O_NONBLOCK)
        return os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8")
    except BaseException:
        os.close(fd)
        raise


def _write_file(path: Path, data: str | bytes | Iterable[bytes], *, root: Path) -> Path:
    """Replace `path` (below `root`) with `data`, atomically: a fresh temporary file beside it (O_EXCL,
    O_NOFOLLOW), then a rename over it — a link at `path` is replaced, never followed; a link on the way is
    refused."""
    chunks: Iterable[bytes] = [data.encode("utf-8")] if isinstance(data, str) else [data] if isinstance(data, bytes) else data
    with _directory(path.parent, root, create=True) as dir_fd:
        tmp = f".{path.name}.tmp-{uuid.uuid4().hex[:8]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _O_NOFOLLOW | _O_CLOEXEC, 0o644, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as f:
                for chunk in chunks:
                    f.write(chunk)
            os.replace(tmp, path.name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(tmp, dir_fd=dir_fd)
            except OSError as exc:
                if exc.errno != errno.ENOENT:
                    raise
            raise
    return path
