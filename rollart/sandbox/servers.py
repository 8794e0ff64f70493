"""Servers a process starts for itself and stops when it ends — a local process serving an ASGI app, or a
container of an image — shared by everything in the process that asks for the same one (the `openenv` env kind's
env servers; rollart/envs/adapters/openenv.py).

In: `server_url(app, image, engine, owner, start_timeout_s)`: `app` is `module.path:attr`, an ASGI app (FastAPI,
Starlette); without `image` it is served by uvicorn in a child process on 127.0.0.1 (an ephemeral port; the
current directory and PYTHONPATH importable); with `image` a container of it runs through `engine` (podman or
docker), its port 8000 published on 127.0.0.1 — the image's own command, or `python3 -m uvicorn app` in it.
Out: the server's URL once `GET /health` answers 200; `ServerError` naming what went wrong (with the server's
log tail) otherwise, within `start_timeout_s`.

Guarantees: one server per (app, image, engine) per process, started on first use; `restart_dead=True` starts
it again when the one it had is gone. A local server's stdout and stderr are read for as long as it runs (a
server whose pipe fills blocks), their last bytes kept for error messages. Nothing outlives the process: a local
server watches a pipe only its starter holds and exits when it closes (a SIGKILLed starter included); a
container carries the labels `rollart.owner=<owner>` and `rollart.creator=<pid>-<start time>`, is removed at
exit, and after a SIGKILL by the next `reap_leftovers` / `reap_containers(engine, owner)`
(rollart/sandbox/container_engine.py). A container server gets the engine's default network (only 127.0.0.1
reaches its published port).
"""

from __future__ import annotations

import atexit
import importlib
import itertools
import os
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from typing import Any, Callable

import httpx

_counter = itertools.count()


class ServerError(RuntimeError):
    """A server that could not be started or did not answer."""


class _Server:
    """A server process or container this process started; its URL once it answers /health."""

    def __init__(self, app: str, image: str, engine: str, owner: str, start_timeout_s: float) -> None:
        self.app, self.image, self.engine, self.owner = app, image, engine, owner
        self.proc: subprocess.Popen | None = None
        self.output: _Output | None = None
        self.container = ""
        self.url = self._start_container(start_timeout_s) if image else self._start_local(start_timeout_s)

    def _start_local(self, timeout_s: float) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, self.app], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        self.output = _Output(self.proc)
        line = self.output.first_line(timeout_s)
        if not line.startswith("port "):
            self.stop()
            raise ServerError(f"the server of app {self.app!r} did not start: {line or self._log()}")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        _wait_healthy(url, timeout_s, self.alive, self._log)
        return url

    def _start_container(self, timeout_s: float) -> str:
        from rollart.sandbox import cgroups
        from rollart.sandbox.container_engine import ULIMITS, engine_cli, engine_cwd, reap_containers

        cli = engine_cli(self.engine)
        reap_containers(self.engine, self.owner)
        self.container = f"rollart-{self.owner}-{cgroups.owner_tag()}-{next(_counter)}-{secrets.token_hex(3)}"
        command = ["python3", "-m", "uvicorn", self.app, "--host", "0.0.0.0", "--port", "8000"] if self.app else []
        started = subprocess.run(
            [cli, "run", "-d", "--rm", "--pull", "never", "--init", "--name", self.container, "--label",
             f"rollart.owner={self.owner}", "--label", f"rollart.creator={cgroups.owner_tag()}", *ULIMITS, "-p",
             "127.0.0.1::8000", self.image, *command], capture_output=True, text=True, timeout=timeout_s,
            cwd=engine_cwd())
        if started.returncode != 0:
            self.stop()
            raise ServerError(f"the container of image {self.image!r} did not start: {started.stderr.strip()[-400:]}")
        port = subprocess.run([cli, "port", self.container, "8000/tcp"], capture_output=True, text=True, timeout=60)
        address = port.stdout.strip().splitlines()[0] if port.returncode == 0 and port.stdout.strip() else ""
        if not address:
            self.stop()
            raise ServerError(f"no published port for container {self.container}: {port.stderr[-200:]}")
        url = f"http://{address}"
        _wait_healthy(url, timeout_s, self.alive, self._log)
        return url

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        from rollart.sandbox.container_engine import engine_cli

        listed = subprocess.run([engine_cli(self.engine), "ps", "-q", "--filter", f"name={self.container}"],
                                capture_output=True, text=True, timeout=60)
        return bool(listed.stdout.strip())

    def _log(self) -> str:
        if self.proc is not None:
            if self.proc.poll() is None:
                return "(still running)"
            return self.output.tail() if self.output is not None else ""
        from rollart.sandbox.container_engine import engine_cli

        logs = subprocess.run([engine_cli(self.engine), "logs", self.container], capture_output=True, text=True,
                              timeout=60)
        return (logs.stdout + logs.stderr)[-800:]

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        if self.container:
            from rollart.sandbox.container_engine import remove_container

            cli = shutil.which(self.engine)
            if cli:
                remove_container(cli, self.engine, self.container)


class _Output:
    """A local server's stdout and stderr, read to their ends by daemon threads for as long as it runs: its first
    stdout line (the port) for its starter, the last `KEEP` bytes of both for its log tail. Pipes nobody reads
    block the server once one fills (64 KiB): uvicorn logs a traceback of thousands of bytes per error, e.g. one
    per WebSocket session that ends (openenv-core's endpoint closes a socket its client already closed)."""

    KEEP = 16384

    def __init__(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        self._first = ""
        self._first_seen = threading.Event()
        self._tail: deque[bytes] = deque()
        self._kept = 0
        self._lock = threading.Lock()
        self._readers = [threading.Thread(target=self._drain, args=(pipe, first), daemon=True,
                                          name=f"server-{'stdout' if first else 'stderr'}-{proc.pid}")
                         for pipe, first in ((proc.stdout, True), (proc.stderr, False))]
        for reader in self._readers:
            reader.start()

    def _drain(self, pipe: Any, first: bool) -> None:
        try:
            if first:
                self._first = pipe.readline().decode(errors="replace")
                self._first_seen.set()
            for chunk in iter(lambda: pipe.read1(65536), b""):
                with self._lock:
                    self._tail.append(chunk)
                    self._kept += len(chunk)
                    while self._kept - len(self._tail[0]) >= self.KEEP:
                        self._kept -= len(self._tail.popleft())
        except (OSError, ValueError):  # the pipe was closed under us
            pass
        finally:
            if first:
                self._first_seen.set()

    def first_line(self, timeout_s: float) -> str:
        """The first stdout line, within `timeout_s` ('' if none)."""
        self._first_seen.wait(timeout_s)
        return self._first.strip()

    def tail(self, chars: int = 800) -> str:
        """The last `chars` characters the server wrote (up to now; all its last ones once it has exited)."""
        for reader in self._readers:
            reader.join(timeout=2)
        with self._lock:
            return b"".join(self._tail).decode(errors="replace")[-chars:]


def _wait_healthy(url: str, timeout_s: float, alive: Callable[[], bool], log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if not alive():
            raise ServerError(f"the server at {url} exited: {log()}")
        time.sleep(0.2)
    raise ServerError(f"the server at {url} did not answer /health in {timeout_s:g}s: {log()}")


_servers: dict[tuple[str, str, str, str], _Server] = {}
_servers_lock = threading.Lock()


def server_url(app: str, image: str, engine: str, owner: str, start_timeout_s: float,
               restart_dead: bool = False) -> str:
    """The URL of this process's server of (app, image, engine), started on first use — and again when
    `restart_dead` and the one it had is gone (see the module docstring)."""
    key = (app, image, engine, owner)
    with _servers_lock:
        server = _servers.get(key)
        if server is not None and restart_dead and not server.alive():
            server.stop()
            server = None
        if server is None:
            server = _servers[key] = _Server(app, image, engine, owner, start_timeout_s)
        return server.url


@atexit.register
def stop_servers() -> None:
    """Stop every server this process started (also run at exit)."""
    with _servers_lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


def _serve(app_spec: str) -> None:
    """Child process of a local server: serve `app_spec` on 127.0.0.1 (an ephemeral port, printed first) until
    its starter is gone (stdin closes) or the server stops."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    module, _, attr = app_spec.partition(":")
    app = importlib.import_module(module)
    for part in attr.split("."):
        app = getattr(app, part)

    def lifeline() -> None:
        sys.stdin.buffer.read()  # returns when the starter is gone
        os._exit(0)

    threading.Thread(target=lifeline, daemon=True).start()
    print(f"port {sock.getsockname()[1]}", flush=True)
    uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=16 << 20)).run(sockets=[sock])


if __name__ == "__main__":
    _serve(sys.argv[1])
