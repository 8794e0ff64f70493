"""`env: openenv` with a server rollart starts itself (`options.app` / `options.image`), over examples/openenv/
guess_env — an env made from OpenEnv's own template: served as a local uvicorn process and in a podman
container (its image built without a registry by examples/openenv/build_image.sh on rollart's env image). A
binary search wins every episode through OpenEnv's own session protocol; a server outlives neither the process
that started it (local: it dies with it; container: `reap_leftovers` removes it). Podman cases skip where podman
or the env image is missing, unless ROLLART_REQUIRE_CONTAINERS=1."""

from __future__ import annotations

import hashlib
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rollart.envs.adapters import openenv as adapter
from rollart.sandbox import servers
from rollart.envs.spec import make_env
from rollart.sandbox.workspace import reap_leftovers

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "openenv"
APP = "guess_env.server.app:app"


@pytest.fixture(autouse=True)
def example_importable(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(EXAMPLE), os.environ.get("PYTHONPATH", "")]))


def play(env) -> float:
    """Binary search over the range the first observation names; the episode's reward."""
    obs, _ = env.reset(seed=11)
    low, high = map(int, re.search(r"from (\d+) to (\d+)", obs).groups())
    for _ in range(6):
        guess = (low + high) // 2
        obs, reward, terminated, _, info = env.step(f'My guess: ```json\n{{"guess": {guess}}}\n```')
        assert "format_error" not in info, obs
        if terminated:
            return reward
        low, high = (guess + 1, high) if "higher" in obs else (low, guess - 1)
    return 0.0


def test_a_local_server_rollart_starts_plays_and_dies_with_its_process():
    env = make_env("openenv", {"app": APP})
    assert play(env) == 1.0
    env.close()
    server = servers._servers[(APP, "", "podman", "openenv")]
    server.proc.kill()  # the server died: the next env cannot open a session, and rollart starts another
    server.proc.wait()
    with pytest.raises(adapter.OpenEnvError, match="openenv: .*refused"):
        make_env("openenv", {"app": APP}).reset(1)
    env = make_env("openenv", {"app": APP})
    assert play(env) == 1.0 and servers._servers[(APP, "", "podman", "openenv")] is not server
    env.close()
    script = ("import sys\nfrom rollart.envs.spec import make_env\n"
              f"e = make_env('openenv', {{'app': {APP!r}}}); e.reset(1)\n"
              "from rollart.sandbox import servers\n"
              "print(next(iter(servers._servers.values())).proc.pid, flush=True)\nimport time; time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ["PYTHONPATH"]])})
    try:
        server_pid = int(child.stdout.readline())
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    deadline = time.monotonic() + 10
    while Path(f"/proc/{server_pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{server_pid}").exists(), "the server outlived the process that started it"


def _image() -> str:
    """The guess_env image, built (cached by a hash of what goes into it) unless podman or the base is missing."""
    from rollart.sandbox import image
    from rollart.sandbox.container_engine import engine_cli
    from rollart.sandbox.isolation import SandboxUnavailable

    try:
        engine_cli("podman")
    except SandboxUnavailable as exc:
        return f"skip: {exc}"
    if image.current_label("podman") is None:
        return f"skip: podman has no {image.IMAGE} image: build it with `make env-image`"
    digest = hashlib.sha256()
    for path in sorted(p for p in EXAMPLE.rglob("*") if p.is_file() and "__pycache__" not in p.parts):
        digest.update(str(path.relative_to(EXAMPLE)).encode() + path.read_bytes())
    tag = f"localhost/rollart-openenv-guess:{digest.hexdigest()[:12]}"
    if subprocess.run(["podman", "image", "exists", tag]).returncode != 0:
        subprocess.run([str(EXAMPLE / "build_image.sh"), tag, "podman"], check=True, timeout=1200,
                       env={**os.environ, "PYTHON": sys.executable})
    return tag


@pytest.fixture(scope="module")
def guess_image() -> str:
    tag = _image()
    if tag.startswith("skip: "):
        if os.environ.get("ROLLART_REQUIRE_CONTAINERS") == "1":
            pytest.fail(f"ROLLART_REQUIRE_CONTAINERS=1 but {tag[6:]}")
        pytest.skip(tag[6:])
    return tag


def containers() -> list[str]:
    out = subprocess.run(["podman", "ps", "-a", "--filter", "label=rollart.owner=openenv", "--format",
                          "{{.Names}}"], capture_output=True, text=True, timeout=60)
    return out.stdout.split()


def test_a_server_in_a_podman_container_plays_and_is_removed(guess_image):
    for options in ({"image": guess_image}, {"image": guess_image, "app": APP}):
        env = make_env("openenv", options)
        assert play(env) == 1.0 and play(env) == 1.0
        env.close()
        assert len(containers()) >= 1
        servers.stop_servers()
        assert containers() == []


def test_a_container_server_left_by_a_killed_process_is_reaped(guess_image):
    script = ("from rollart.envs.spec import make_env\n"
              f"e = make_env('openenv', {{'image': {guess_image!r}}}); e.reset(1)\n"
              "print('up', flush=True)\nimport time; time.sleep(600)\n")
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ["PYTHONPATH"]])})
    try:
        assert child.stdout.readline().strip() == "up"
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
        child.stdout.close()
    assert len(containers()) == 1  # the killed process could not remove it
    assert reap_leftovers("openenv") == 1
    assert containers() == []
