"""The code sandbox stops an infinite loop, a memory bomb and a fork bomb, keeps writes in its directory,
has no network, and says which isolation it had."""

from __future__ import annotations

import os
import secrets
import socket
import uuid
from pathlib import Path

import pytest

from rollart.config import SandboxConfig
from rollart.reward.sandbox import probe_isolation, run_sandboxed

CFG = SandboxConfig(cpu_time_s=1.0, memory_mb=128, wall_timeout_s=4.0, max_processes=8)


def run(code: str, cfg: SandboxConfig = CFG, env: dict | None = None):
    return run_sandboxed({"main.py": code}, ["python", "main.py"], cfg, env=env)


def processes_with_marker(marker: str) -> list[int]:
    """Processes whose environment holds `marker` (survivors of a sandbox run)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if marker.encode() in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
            except OSError:
                pass
    return found


def test_isolation_is_reported():
    res = run("print('ok')")
    assert res.exit_code == 0 and res.stdout == "ok\n"
    iso = probe_isolation()
    assert res.isolation.startswith("process+rlimits")
    assert ("netns" in res.isolation) == iso.netns and ("pidns" in res.isolation) == iso.pidns


def test_infinite_loop_is_stopped():
    res = run("while True:\n    pass\n")
    assert res.killed_by_limit and res.exit_code is None
    assert res.wall_s < CFG.wall_timeout_s + 3


def test_memory_bomb_is_stopped():
    res = run("chunks = []\nwhile True:\n    chunks.append(bytearray(10 * 2**20))\n")
    assert res.exit_code != 0
    assert "MemoryError" in res.stderr or res.killed_by_limit


def test_fork_bomb_is_stopped_and_leaves_no_process():
    marker = f"ROLLART_SBX_{secrets.token_hex(6)}"
    code = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    res = run(code, env={"SBX_MARKER": marker})
    assert res.killed_by_limit or res.exit_code != 0
    assert res.wall_s < CFG.wall_timeout_s + 5
    assert processes_with_marker(marker) == []


def test_writes_stay_inside_the_working_dir(tmp_path):
    name = f"rollart-escape-{uuid.uuid4().hex}"
    targets = [Path("/tmp") / name, Path.cwd() / name, Path("/dev/shm") / name]
    code = "import sys\nok = 0\nfor p in sys.argv[1:] or %r:\n" % [str(t) for t in targets] + (
        "    try:\n        open(p, 'w').write('x')\n        print('WROTE', p)\n    except OSError as e:\n"
        "        print('DENIED', p)\nopen('inside.txt', 'w').write('fine')\nprint(open('inside.txt').read())\n"
    )
    res = run(code)
    assert res.exit_code == 0, res.stderr
    assert "WROTE" not in res.stdout and res.stdout.count("DENIED") == 3 and "fine" in res.stdout
    assert not any(t.exists() for t in targets)


def test_no_network_when_denied():
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.5)
    port = listener.getsockname()[1]
    code = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=1)\n    print('CONNECTED')\n"
        "except OSError as e:\n    print('NO-NET', type(e).__name__)\n"
    )
    try:
        res = run(code)
        with pytest.raises(socket.timeout):
            listener.accept()  # nothing reached the host's loopback
    finally:
        listener.close()
    assert "NO-NET" in res.stdout, (res.stdout, res.stderr)
    assert "netns" in res.isolation or "landlock-net" in res.isolation


def test_working_dir_is_removed_afterwards():
    res = run("import os\nprint(os.getcwd())")
    assert res.exit_code == 0 and not Path(res.stdout.strip()).exists()


def test_file_names_cannot_escape():
    with pytest.raises(ValueError, match="outside the working dir"):
        run_sandboxed({"../evil.py": "x"}, ["python", "evil.py"], CFG)
