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

Servers rollart starts (rollart/sandbox/servers.py) are shared by every env of the process with the same
options and stopped when it exits; a local server dies with the process that started it (it watches a pipe only
that process holds), a container carries rollart's labels (owner `openenv`) and is reaped by `reap_leftovers`
like workspace containers; one that died is started again for the next env. A container server gets the
engine's default network (its port published on 127.0.0.1 only) — an env that runs what the policy writes can
reach what that network reaches. Each session holds one of the server's env instances:
serve with `max_concurrent_envs` ≥ the envs one process runs at once (the template's default is 1).

Expert: none (OpenEnv has no oracle policy); random: a well-formed action drawn from the schema.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
from concurrent.futures import Future
from typing import Any

import httpx

from rollart.envs.adapters.user_object import import_user_object
from rollart.sandbox.servers import ServerError, server_url

HIDDEN_FIELDS = ("reward", "done", "metadata")
_FENCE = re.compile(r"```(?:json)?\s*\n(.*?)```", re.DOTALL)


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
        """Start the server if rollart runs it, read its action schema, open a session (all before a reset). A
        server rollart runs that died is started again (this env fails; the next one reaches the new server)."""
        if self.options["url"]:
            self._open()
            return
        spec = (self.options["app"], self.options["image"], self.options["engine"], "openenv")
        try:
            self.url = server_url(*spec, self.start_timeout_s)
        except ServerError as exc:
            raise OpenEnvError(f"openenv: {exc}") from None
        try:
            self._open()
        except OpenEnvError:
            server_url(*spec, self.start_timeout_s, restart_dead=True)
            raise

    def _open(self) -> None:
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
