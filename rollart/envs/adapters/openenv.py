"""`openenv` — an OpenEnv environment server (`openenv-core`) as a rollart env, over OpenEnv's own protocol.

In (`domains.<d>.options`), one of:
- `url`: a running OpenEnv server (`http://host:port`);
- `app`: `module.path:app`, its FastAPI app (`create_app(...)` of OpenEnv's template): rollart starts the server
  itself — a local uvicorn process on 127.0.0.1 (the current directory is importable), or, with `image`, in a
  container of that image through `engine` (podman or docker; the image's Python must have openenv-core and
  the app); `image` without `app` runs the image's own command (OpenEnv's images serve on port 8000).
Optional: `action_field` (the whole response is that field of the action), `parse_action` (`module:function`,
text → the action's dict; ValueError = a malformed action), `render` (`module:function`, the observation's dict
→ text), `timeout_s` (one message), `start_timeout_s` (a server to answer /health), `max_action_chars`.

Out: the env protocol. An episode is one OpenEnv session: openenv-core's own client (`GenericEnvClient`: the
`/ws` WebSocket, `reset`/`step` messages — OpenEnv's HTTP `/reset` and `/step` make a fresh env per call, so
they cannot carry an episode) on one event loop thread shared by every env of the process. `reset(seed)` sends
`seed` (a server whose env takes none ignores it); the observation's fields (not reward, done, metadata) are
rendered as text — a single field as itself, several as `name: value` lines — and the first observation ends
with how to act: a JSON object whose fields the server's action schema (`GET /schema`) lists. `step(text)`
parses the action: by default the last ```json block or the last `{...}` object in the text, checked against
that schema (`jsonschema`) before it is sent; a parse or schema error, or the server's own validation error,
is a format error the policy reads (the episode goes on). Reward and `done` are the server's.
`prepare()` (the warm pool's) starts the server if needed and opens the session ahead of a reset.

Servers rollart starts are shared by every env of the process with the same options and stopped when it
exits; a local server dies with the process that started it (it watches a pipe only that process holds), a
container carries rollart's labels and is reaped by `reap_leftovers` like workspace containers. A container
server gets the engine's default network (its port published on 127.0.0.1 only) — an env that runs what the
policy writes can reach what that network reaches. Each session holds one of the server's env instances:
serve with `max_concurrent_envs` ≥ the envs one process runs at once (the template's default is 1).

Expert: none (OpenEnv has no oracle policy); random: a well-formed action drawn from the schema.
"""

from __future__ import annotations

import asyncio
import atexit
import itertools
import json
import os
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

import httpx

from rollart.envs.adapters.user_object import import_user_object

HIDDEN_FIELDS = ("reward", "done", "metadata")
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)
_counter = itertools.count()


class OpenEnvError(RuntimeError):
    """An OpenEnv server that could not be started or reached."""


# --- one event loop for every env's client -----------------------------------------------------------------
_loop: asyncio.AbstractEventLoop | None = None
_loop_lock = threading.Lock()


def _run(coro: Any, timeout_s: float) -> Any:
    """Run a coroutine on the shared loop thread; its result within `timeout_s`."""
    global _loop
    with _loop_lock:
        if _loop is None:
            _loop = asyncio.new_event_loop()
            threading.Thread(target=_loop.run_forever, name="openenv-clients", daemon=True).start()
    future: Future[Any] = asyncio.run_coroutine_threadsafe(coro, _loop)
    try:
        return future.result(timeout_s)
    except TimeoutError:
        future.cancel()
        raise OpenEnvError(f"an OpenEnv call did not answer in {timeout_s:g}s") from None


# --- servers rollart starts ---------------------------------------------------------------------------------
class _Server:
    """A server process or container this process started; its URL once it answers /health."""

    def __init__(self, app: str, image: str, engine: str, start_timeout_s: float) -> None:
        self.app, self.image, self.engine = app, image, engine
        self.proc: subprocess.Popen | None = None
        self.container = ""
        self.url = self._start_container(start_timeout_s) if image else self._start_local(start_timeout_s)

    def _start_local(self, timeout_s: float) -> str:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")])}
        self.proc = subprocess.Popen([sys.executable, "-m", __name__, self.app], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, start_new_session=True)
        line = _readline(self.proc, timeout_s)
        if not line.startswith("port "):
            self.stop()
            raise OpenEnvError(f"openenv: the server of app {self.app!r} did not start: {line or self._log()}")
        url = f"http://127.0.0.1:{int(line.split()[1])}"
        _wait_healthy(url, timeout_s, self._alive, self._log)
        return url

    def _start_container(self, timeout_s: float) -> str:
        from rollart.sandbox import cgroups
        from rollart.sandbox.container_engine import ULIMITS, engine_cli, reap_containers

        cli = engine_cli(self.engine)
        reap_containers(self.engine, "openenv")
        self.container = f"rollart-openenv-{cgroups.owner_tag()}-{next(_counter)}-{secrets.token_hex(3)}"
        command = ["python3", "-m", "uvicorn", self.app, "--host", "0.0.0.0", "--port", "8000"] if self.app else []
        started = subprocess.run(
            [cli, "run", "-d", "--rm", "--pull", "never", "--init", "--name", self.container, "--label",
             "rollart.owner=openenv", "--label", f"rollart.creator={cgroups.owner_tag()}", *ULIMITS, "-p",
             "127.0.0.1::8000", self.image, *command], capture_output=True, text=True, timeout=timeout_s)
        if started.returncode != 0:
            self.stop()
            raise OpenEnvError(f"openenv: the container of image {self.image!r} did not start: "
                               f"{started.stderr.strip()[-400:]}")
        port = subprocess.run([cli, "port", self.container, "8000/tcp"], capture_output=True, text=True, timeout=60)
        address = port.stdout.strip().splitlines()[0] if port.returncode == 0 and port.stdout.strip() else ""
        if not address:
            self.stop()
            raise OpenEnvError(f"openenv: no published port for container {self.container}: {port.stderr[-200:]}")
        url = f"http://{address}"
        _wait_healthy(url, timeout_s, self._alive, self._log)
        return url

    def _alive(self) -> bool:
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
            return (self.proc.stderr.read() if self.proc.stderr else b"").decode(errors="replace")[-800:]
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


def _readline(proc: subprocess.Popen, timeout_s: float) -> str:
    """The server process's first stdout line, within `timeout_s` ('' if none)."""
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.append(proc.stdout.readline().decode(errors="replace")), daemon=True)
    reader.start()
    reader.join(timeout_s)
    return out[0].strip() if out else ""


def _wait_healthy(url: str, timeout_s: float, alive: Callable[[], bool], log: Callable[[], str]) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2, trust_env=False).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        if not alive():
            raise OpenEnvError(f"openenv: the server at {url} exited: {log()}")
        time.sleep(0.2)
    raise OpenEnvError(f"openenv: the server at {url} did not answer /health in {timeout_s:g}s: {log()}")


_servers: dict[tuple[str, str, str], _Server] = {}
_servers_lock = threading.Lock()


def _server_url(app: str, image: str, engine: str, start_timeout_s: float) -> str:
    key = (app, image, engine)
    with _servers_lock:
        if key not in _servers:
            _servers[key] = _Server(app, image, engine, start_timeout_s)
        return _servers[key].url


@atexit.register
def _stop_servers() -> None:
    with _servers_lock:
        for server in _servers.values():
            server.stop()
        _servers.clear()


# --- actions and observations --------------------------------------------------------------------------------
def _last_object(text: str) -> str | None:
    """The last fenced block, else the last balanced `{...}` in `text`."""
    blocks = _FENCE.findall(text)
    if blocks:
        return blocks[-1].strip()
    end = text.rfind("}")
    while end >= 0:
        depth = 0
        for i in range(end, -1, -1):
            depth += {"}": 1, "{": -1}.get(text[i], 0)
            if depth == 0:
                return text[i:end + 1]
        end = text.rfind("}", 0, end)
    return None


def _describe(schema: dict[str, Any]) -> str:
    """How to act, from the action schema: its fields, their types and descriptions."""
    required = set(schema.get("required", ()))
    fields = []
    for name, prop in schema.get("properties", {}).items():
        if name == "metadata":
            continue
        kind = prop.get("type") or "/".join(p.get("type", "?") for p in prop.get("anyOf", ())) or "value"
        fields.append(f'"{name}" ({kind}{", required" if name in required else ""})'
                      + (f": {prop['description']}" if prop.get("description") else ""))
    return "Act with a JSON object: " + "; ".join(fields) + "."


def _sample(schema: dict[str, Any], rng: random.Random) -> Any:
    """A random value that fits a (simple) JSON schema."""
    if "enum" in schema:
        return rng.choice(schema["enum"])
    if "anyOf" in schema:
        return _sample(next((s for s in schema["anyOf"] if s.get("type") != "null"), schema["anyOf"][0]), rng)
    kind = schema.get("type", "string")
    if kind == "integer":
        return rng.randint(int(schema.get("minimum", 0)), int(schema.get("maximum", 9)))
    if kind == "number":
        return rng.uniform(float(schema.get("minimum", 0)), float(schema.get("maximum", 1)))
    if kind == "boolean":
        return rng.random() < 0.5
    if kind == "array":
        return []
    if kind == "object":
        props = schema.get("properties", {})
        return {k: _sample(v, rng) for k, v in props.items() if k in schema.get("required", ()) and k != "metadata"}
    return rng.choice(("yes", "no", "left", "right", "hello", "42"))


class OpenEnvEnv:
    """An OpenEnv server's env, one session per episode (see the module docstring)."""

    TAKES_ID = False
    FORM = "openenv"
    EXAMPLE = "openenv (options: url: http://127.0.0.1:8000, or app: my_env.server.app:app)"

    def __init__(self, url: str = "", app: str = "", image: str = "", engine: str = "podman", action_field: str = "",
                 parse_action: str = "", render: str = "", timeout_s: float = 60.0, start_timeout_s: float = 120.0,
                 max_action_chars: int = 65536) -> None:
        if bool(url) == bool(app or image):
            raise ValueError("openenv: set exactly one of options.url (a running server) and options.app "
                             "(module.path:app) / options.image (rollart starts the server); got "
                             f"url={url!r}, app={app!r}, image={image!r}")
        if url and not url.startswith(("http://", "https://")):
            raise ValueError(f"openenv: options.url must be http(s)://HOST:PORT, got {url!r}")
        if app and (":" not in app or not all(p.isidentifier() for p in app.split(":", 1)[0].split("."))):
            raise ValueError(f"openenv: options.app must be module.path:app, got {app!r}")
        if engine not in ("podman", "docker"):
            raise ValueError(f"openenv: options.engine must be podman or docker, got {engine!r}")
        if action_field and parse_action:
            raise ValueError("openenv: set at most one of options.action_field and options.parse_action")
        self.options = {"url": url, "app": app, "image": image, "engine": engine}
        self.timeout_s, self.start_timeout_s, self.max_action_chars = timeout_s, start_timeout_s, max_action_chars
        self.action_field = action_field
        accepted = "'module.path:function' (the current directory is importable)"
        self._parse = import_user_object(parse_action, "openenv options.parse_action", accepted, ValueError) \
            if parse_action else None
        self._render = import_user_object(render, "openenv options.render", accepted, ValueError) if render else None
        self.url = url.rstrip("/")
        self.schema: dict[str, Any] = {}
        self._client: Any = None
        self._rng = random.Random(0)

    # --- connection ---------------------------------------------------------------------------------------
    def prepare(self) -> None:
        """Start the server if rollart runs it, read its action schema, open a session (all before a reset)."""
        if not self.url:
            self.url = _server_url(self.options["app"], self.options["image"], self.options["engine"],
                                   self.start_timeout_s)
        if not self.schema:
            try:
                response = httpx.get(f"{self.url}/schema", timeout=self.timeout_s, trust_env=False)
                self.schema = dict(response.json().get("action") or {})
            except (httpx.HTTPError, ValueError, AttributeError) as exc:
                raise OpenEnvError(f"openenv: {self.url}/schema did not give an action schema: {exc}") from None
        if self._client is None:
            from openenv.core.generic_client import GenericEnvClient

            client = GenericEnvClient(base_url=self.url, connect_timeout_s=self.timeout_s,
                                      message_timeout_s=self.timeout_s)
            try:
                _run(client.connect(), self.timeout_s + 5)
            except (ConnectionError, OSError) as exc:
                raise OpenEnvError(f"openenv: no session at {self.url}: {exc}") from None
            self._client = client

    def close(self) -> None:
        client, self._client = self._client, None
        if client is not None:
            try:
                _run(client.close(), 10)
            except Exception:  # the session dies with the connection either way
                pass

    # --- the env protocol ----------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.prepare()
        self._rng = random.Random(seed)
        result = self._call("reset", self._client.reset(seed=seed))
        return f"{self._text(result.observation)}\n{_describe(self.schema)}", {"metadata": self._metadata(result)}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        if self._client is None:
            raise RuntimeError("openenv: step() before reset()")
        try:
            payload = self.parse(action)
        except ValueError as exc:
            return self._malformed(str(exc))
        try:
            result = self._call("step", self._client.step(payload))
        except _Refused as exc:
            return self._malformed(f"the server refused the action: {exc}")
        reward = float(result.reward) if isinstance(result.reward, (int, float)) else 0.0
        return self._text(result.observation), reward, bool(result.done), False, {"metadata": self._metadata(result)}

    def _malformed(self, problem: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return f"Invalid action: {problem}. {_describe(self.schema)}", 0.0, False, False, {"format_error": problem}

    def _call(self, what: str, coro: Any) -> Any:
        try:
            return _run(coro, self.timeout_s + 5)
        except RuntimeError as exc:
            if "VALIDATION_ERROR" in str(exc):
                raise _Refused(str(exc)) from None
            raise OpenEnvError(f"openenv: {what} at {self.url} failed: {exc}") from None
        except (ConnectionError, OSError, asyncio.TimeoutError) as exc:
            raise OpenEnvError(f"openenv: {what} at {self.url} failed: {type(exc).__name__}: {exc}") from None

    def parse(self, text: str) -> dict[str, Any]:
        """The action's dict from the model's text; ValueError naming what is wrong."""
        if len(text) > self.max_action_chars:
            raise ValueError(f"the action is over {self.max_action_chars} characters")
        if self._parse is not None:
            action = self._parse(text)
        elif self.action_field:
            action = {self.action_field: text.strip()}
        else:
            found = _last_object(text)
            if found is None:
                raise ValueError("no JSON object found")
            try:
                action = json.loads(found)
            except ValueError as exc:
                raise ValueError(f"the JSON object does not parse ({exc})") from None
        if not isinstance(action, dict):
            raise ValueError(f"the action must be a JSON object, got {type(action).__name__}")
        if self.schema:
            import jsonschema

            try:
                jsonschema.validate(action, self.schema)
            except jsonschema.ValidationError as exc:
                where = "/".join(str(p) for p in exc.absolute_path)
                raise ValueError(f"{where + ': ' if where else ''}{exc.message}"[:300]) from None
        return action

    def _text(self, observation: Any) -> str:
        if self._render is not None:
            return str(self._render(observation))
        shown = {k: v for k, v in dict(observation or {}).items() if k not in HIDDEN_FIELDS}
        if len(shown) == 1:
            value = next(iter(shown.values()))
            return value if isinstance(value, str) else json.dumps(value)
        return "\n".join(f"{k}: {v if isinstance(v, str) else json.dumps(v)}" for k, v in shown.items())

    @staticmethod
    def _metadata(result: Any) -> dict[str, Any]:
        observation = result.observation if isinstance(result.observation, dict) else {}
        metadata = observation.get("metadata")
        return dict(metadata) if isinstance(metadata, dict) else {}

    def random_action(self) -> str:
        return json.dumps(_sample({"type": "object", **self.schema}, self._rng))


class _Refused(Exception):
    """The server's own validation refused an action (the policy's error, not the server's)."""


def _serve(app_spec: str) -> None:
    """Child process of a local server: serve `app_spec` on 127.0.0.1 (an ephemeral port, printed first) until
    the parent dies (stdin closes) or the server stops."""
    import uvicorn

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = import_user_object(app_spec, "openenv options.app", "'module.path:app'", ValueError)

    def lifeline() -> None:
        sys.stdin.buffer.read()  # returns when the parent is gone
        os._exit(0)

    threading.Thread(target=lifeline, daemon=True).start()
    print(f"port {sock.getsockname()[1]}", flush=True)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", ws_max_size=16 << 20))
    server.run(sockets=[sock])


if __name__ == "__main__":
    _serve(sys.argv[1])
