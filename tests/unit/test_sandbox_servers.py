"""Local servers rollart starts (rollart/sandbox/servers.py) without OpenEnv: a server that writes far more than
a pipe holds keeps answering (its output is read for as long as it runs), and one that dies names its log tail.
Played with OpenEnv's own server in tests/contracts/test_openenv_served.py."""

from __future__ import annotations

import textwrap

import httpx
import pytest

from rollart.sandbox import servers

NOISY_APP = textwrap.dedent('''
    import sys

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        if scope["path"] == "/noise":  # like uvicorn's traceback of every failed request, many times over
            for _ in range(8):
                sys.stderr.write("x" * 4095 + "\\n")
                sys.stdout.write("y" * 4095 + "\\n")
            sys.stderr.flush()
            sys.stdout.flush()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
''')


@pytest.fixture
def app_dir(tmp_path, monkeypatch):
    (tmp_path / "noisy_app.py").write_text(NOISY_APP)
    (tmp_path / "dying_app.py").write_text("import sys\nsys.stderr.write('the app broke: ' + 'z' * 50)\n"
                                            "raise SystemExit(3)\n")
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    servers.stop_servers()


def test_a_server_that_writes_more_than_its_pipes_hold_keeps_answering(app_dir):
    url = servers.server_url("noisy_app:app", "", "podman", "test", start_timeout_s=60)
    for _ in range(12):  # 12 × 64 KiB on each of stdout and stderr: a pipe nobody reads blocks after the first
        assert httpx.get(f"{url}/noise", timeout=10, trust_env=False).text == "ok"
    server = servers._servers[("noisy_app:app", "", "podman", "test")]
    assert server.alive()
    server.stop()
    tail = server._log()
    assert 0 < len(tail) <= 800 and set(tail.strip()) <= {"x", "y", "\n"}


def test_a_server_that_dies_at_start_names_its_log_tail(app_dir):
    with pytest.raises(servers.ServerError, match="did not start: .*the app broke: z+"):
        servers.server_url("dying_app:app", "", "podman", "test", start_timeout_s=60)
