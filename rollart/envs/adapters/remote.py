"""The `remote` env kind: an environment that lives in an env server (`rollart env serve`) elsewhere.

In: `domains.<d>.env: remote:http://host:port` (options: `urls: [...]`, more servers of the same domain),
the server token in the env var `token_env` (default ROLLART_ENV_TOKEN),
and `timeout_s` (a bound on one HTTP call; the env plane's own reset/step timeouts still apply). Out:
the env protocol (`reset`, `step`, `close`, `expert_action`, `random_action`) over the protocol of
`rollart/envs/serving/server.py`; sync methods, so they run in the env worker's thread pool like any sync env.

Failures: a server that does not answer (died, unreachable) or answers an error raises
`RemoteEnvError` naming the server and the reason — the EnvManager then retries a reset (on the next
server) or ends the trajectory FAILED with that reason, and the control plane replaces it with the same
seed. A server that failed is skipped by resets for `DOWN_S` seconds, so new trajectories go to the
servers that answer; nothing of a trajectory is lost but the unfinished one.

Managed servers (`domains.<d>.env_servers`, rollart/envs/serving/fleet.py): `directory` is the fleet's
`ServerDirectory` actor, asked for the live URLs and the token (at most once a second per process, and
again after a server failed), so a replaced server is used as soon as it joined.

One keep-alive connection pool per process (httpx, thread-safe) serves every remote env.
"""

from __future__ import annotations

import functools
import itertools
import os
import threading
import time
from typing import Any

import httpx

DOWN_S = 10.0
_down: dict[str, float] = {}  # server url → when it failed (process-wide: every remote env learns it)
_round_robin = itertools.count()
_lock = threading.Lock()
_failure_count = [0]  # server failures seen by this process (a managed directory is asked again after one)


class RemoteEnvError(RuntimeError):
    """An env server that did not answer, or answered an error."""


@functools.lru_cache(maxsize=1)
def _client() -> httpx.Client:
    return httpx.Client(limits=httpx.Limits(max_connections=512, max_keepalive_connections=128), trust_env=False)


class RemoteEnv:
    """An env of a remote env server (see the module docstring)."""

    FORM = "remote:<url>"
    EXAMPLE = "remote:http://127.0.0.1:8710"

    def __init__(self, url: str = "", urls: list[str] | tuple[str, ...] = (), token_env: str = "ROLLART_ENV_TOKEN",
                 timeout_s: float = 120.0, directory: Any = None, domain: str = "") -> None:
        self.timeout_s, self._directory, self._domain = timeout_s, directory, domain
        self._server = self._session = self._session_token = ""
        if directory is not None:
            self.servers, self._token = [], ""
            return
        servers = [u.rstrip("/") for u in ([url] if url else []) + list(urls)]
        if not servers or not all(s.startswith(("http://", "https://")) for s in servers):
            raise ValueError(f"remote: the env spec is remote:http://HOST:PORT of `rollart env serve` (more in "
                             f"options.urls); got url={url!r}, urls={list(urls)!r}")
        token = os.environ.get(token_env, "")
        if not token:
            raise ValueError(f"remote: set ${token_env} to the token `rollart env serve` prints (or runs with)")
        self.servers, self._token = servers, token

    # --- HTTP ----------------------------------------------------------------------------------------
    def _call(self, method: str, server: str, path: str, token: str, body: dict[str, Any] | None = None) -> Any:
        try:
            response = _client().request(method, server + path, json=body, timeout=self.timeout_s,
                                         headers={"authorization": f"Bearer {token}"})
        except httpx.HTTPError as exc:
            with _lock:
                _down[server] = time.monotonic()
                _failure_count[0] += 1
            raise RemoteEnvError(f"env server {server} did not answer {method} {path}: "
                                 f"{type(exc).__name__}: {exc} (did it die?)") from None
        try:
            data = response.json()
        except ValueError:
            data = None
        if response.status_code != 200:
            error = (data or {}).get("error", {}) if isinstance(data, dict) else {}
            message = error.get("message") or response.text[:300]
            raise RemoteEnvError(f"env server {server}: {response.status_code} {error.get('code', '')}: {message}")
        if not isinstance(data, dict):
            raise RemoteEnvError(f"env server {server}: answered {response.text[:200]!r}, not a JSON object")
        return data

    def _servers_to_try(self) -> list[str]:
        """Every server, starting at the next in round-robin order, the ones that failed lately last."""
        if self._directory is not None:
            self.servers, self._token = _lookup(self._directory, self._domain)
            if not self.servers:
                raise RemoteEnvError(f"no env server of domain {self._domain!r} is alive (a replacement may be "
                                     "starting)")
        start = next(_round_robin) % len(self.servers)
        ordered = self.servers[start:] + self.servers[:start]
        now = time.monotonic()
        with _lock:
            return sorted(ordered, key=lambda s: now - _down.get(s, -1e9) < DOWN_S)

    # --- the env protocol ------------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        self.close()
        errors: list[str] = []
        for server in self._servers_to_try():
            try:
                data = self._call("POST", server, "/v1/reset", self._token, {"seed": seed})
            except RemoteEnvError as exc:
                errors.append(str(exc))
                if "did not answer" not in str(exc):
                    break  # the server answered: its error is the env's, not the server's absence
                continue
            self._server, self._session, self._session_token = server, str(data["session"]), str(data["token"])
            return str(data["observation"]), dict(data.get("info") or {})
        raise RemoteEnvError("; ".join(errors))

    def _in_session(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        if not self._session:
            raise RuntimeError("remote: step() before reset()")
        return self._call(method, self._server, f"/v1/sessions/{self._session}{path}", self._session_token, body)

    def __getstate__(self) -> dict[str, Any]:  # picklable: a directory handle travels, a session does not
        return {**self.__dict__, "_session": "", "_session_token": ""}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        data = self._in_session("POST", "/step", {"action": action})
        return (str(data["observation"]), float(data["reward"]), bool(data["terminated"]), bool(data["truncated"]),
                dict(data.get("info") or {}))

    def expert_action(self) -> str:
        return str(self._in_session("POST", "/action", {"policy": "expert"})["action"])

    def random_action(self) -> str:
        return str(self._in_session("POST", "/action", {"policy": "random"})["action"])

    def close(self) -> None:
        """End the session on its server (best effort: a dead server's sessions died with it)."""
        if self._session:
            try:
                self._in_session("DELETE", "")
            except RemoteEnvError:
                pass
            self._session = self._session_token = ""



_answers: dict[tuple[str, str], tuple[float, int, list[str], str]] = {}  # (directory, domain) → when, failures, …


def _lookup(directory: Any, domain: str) -> tuple[list[str], str]:
    """The directory's (urls, token), asked again each second and after every new server failure."""
    import ray

    key = (directory._actor_id.hex(), domain)
    with _lock:
        cached, failures = _answers.get(key), _failure_count[0]
    if cached is not None and time.monotonic() - cached[0] < 1.0 and cached[1] == failures:
        return list(cached[2]), cached[3]
    urls, token = ray.get(directory.get.remote(domain), timeout=30)
    with _lock:
        _answers[key] = (time.monotonic(), failures, list(urls), token)
    return list(urls), token
