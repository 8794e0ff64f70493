"""What one request may cost the agent gateway is bounded before the work it asks for (issue: a 3.9 MB message
was tokenised for ~9 s while another trajectory's call waited as long; slow headers, huge header lines, stalled
bodies and malformed Content-Length were not bounded or not answered in JSON).

Timings are medians of a few tries (the build machines are shared); the bounds are the issue's."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import httpx
import pytest

from rollart.config import GatewayConfig
from rollart.envs.agents.gateway import AgentGateway
from rollart.envs.agents.session import SessionLimits
from rollart.envs.chat import ChatTokens
from rollart.models.tiny import build_tokenizer
from rollart.types import SamplingParams
from tests.unit.envs_fakes import ScriptedLLM


@pytest.fixture(scope="module")
def chat() -> ChatTokens:
    return ChatTokens(build_tokenizer())


class Gateway:
    """A started gateway over a scripted LLM that answers at once."""

    def __init__(self, chat: ChatTokens, **limits) -> None:
        self.gateway = AgentGateway(ScriptedLLM(chat.tokenizer, lambda request, k: "ok"), chat,
                                    GatewayConfig(**limits)).start()
        self.sampling = SamplingParams(temperature=1.0, max_new_tokens=8, stop_token_ids=chat.stop_token_ids)

    def open(self, tid: str, max_total_tokens: int = 2048) -> tuple[str, dict[str, str]]:
        base, key = self.gateway.open(tid, domain="agent", limits=SessionLimits(8, max_total_tokens),
                                      sampling=self.sampling)
        return base, {"authorization": f"Bearer {key}", "content-type": "application/json"}

    def raw(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.gateway.port), timeout=15)


@pytest.fixture
def make(chat):
    started: list[Gateway] = []

    def start(**limits) -> Gateway:
        started.append(Gateway(chat, **limits))
        return started[-1]

    yield start
    for g in started:
        g.gateway.stop()


def answer(sock: socket.socket, closes: bool = True) -> tuple[int, dict, float]:
    """(status, JSON body, seconds) of the response the server writes; `closes`: and the server then closes
    the connection."""
    began, data = time.monotonic(), b""
    while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length"))
    while len(body) < length and (chunk := sock.recv(65536)):
        body += chunk
    waited = time.monotonic() - began
    if closes:
        assert sock.recv(1) == b"", "the server kept the connection open"
    return int(head.split()[1]), json.loads(body), waited


def test_a_huge_message_is_refused_at_once_and_stalls_no_other_trajectory(make):
    g = make()
    big_base, big_headers = g.open("big/0")
    small_base, small_headers = g.open("small/0")
    words = " ".join(f"word{i % 977}" for i in range(500_000))  # 3.9 MB of text, ~10x more tokens than fit
    body = json.dumps({"model": "m", "messages": [{"role": "user", "content": words}]}).encode()
    assert 3.8e6 < len(body) < 4 * 2**20
    refused, others, stop = [], [], threading.Event()
    with httpx.Client(timeout=30) as big, httpx.Client(timeout=30) as small:
        def flood() -> None:
            while not stop.is_set():
                began = time.perf_counter()
                r = big.post(f"{big_base}/chat/completions", content=body, headers=big_headers)
                refused.append(time.perf_counter() - began)
                assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"

        small.get(f"{small_base}/models", headers=small_headers)  # the connection is up
        thread = threading.Thread(target=flood)
        thread.start()
        try:
            for _ in range(7):
                time.sleep(0.05)
                began = time.perf_counter()
                assert small.get(f"{small_base}/models", headers=small_headers).status_code == 200
                others.append(time.perf_counter() - began)
        finally:
            stop.set()
            thread.join(60)
    assert len(refused) >= 3, refused
    assert statistics.median(refused) <= 0.050, refused  # tokenised first on main: 8.7-9.7 s
    assert statistics.median(others) <= 0.100, others  # waited up to 9.7 s on main


def test_slow_headers_are_cut_at_the_read_timeout(make):
    g = make(header_timeout_s=0.5)
    with g.raw() as sock:  # a request line and one header, then nothing
        sock.sendall(b"POST /t/x/v1/chat/completions HTTP/1.1\r\nhost: a\r\n")
        status, body, waited = answer(sock)
    assert status == 408 and body["error"]["code"] == "request_timeout"
    assert 0.4 <= waited <= 5.0, waited  # on main the connection stayed open (75 s and more)
    with g.raw() as idle:  # a connection that never sends a byte
        assert answer(idle)[0] == 408


def test_a_slow_body_is_cut_at_its_timeout(make):
    g = make(body_timeout_s=0.5)
    base, headers = g.open("slow/0")
    with g.raw() as sock:
        path = base.split(str(g.gateway.port), 1)[1]
        sock.sendall(f"POST {path}/chat/completions HTTP/1.1\r\nhost: a\r\nauthorization: {headers['authorization']}"
                     "\r\ncontent-type: application/json\r\ncontent-length: 1000\r\n\r\n{\"mo".encode())
        status, body, waited = answer(sock)
    assert status == 408 and body["error"]["code"] == "request_timeout" and waited <= 5.0


def test_header_size_and_count_caps_answer_431_in_json(make):
    g = make(max_header_kb=4, max_headers=20)
    with g.raw() as sock:
        sock.sendall(b"GET /t/x/v1/models HTTP/1.1\r\nhost: a\r\nx-big: " + b"a" * 64 * 1024 + b"\r\n\r\n")
        status, body, _ = answer(sock)
    assert status == 431 and body["error"]["code"] == "headers_too_large"
    r = httpx.get(f"{g.gateway.url}/t/x/v1/models", headers={f"x-h{i}": "1" for i in range(30)})
    assert r.status_code == 431 and r.json()["error"]["code"] == "too_many_headers"


def test_a_malformed_content_length_gets_a_json_error(make):
    g = make()
    with g.raw() as sock:
        sock.sendall(b"POST /t/x/v1/chat/completions HTTP/1.1\r\nhost: a\r\ncontent-length: 12abc\r\n\r\n{}")
        status, body, _ = answer(sock)
    assert status == 400 and body["error"]["code"] == "malformed_request"  # uvicorn's plain text on main


def test_open_connections_are_capped(make):
    g = make(max_connections=3)
    held = [g.raw() for _ in range(3)]
    try:
        time.sleep(0.2)
        with g.raw() as extra:
            status, body, _ = answer(extra)
        assert status == 503 and body["error"]["code"] == "too_many_connections"
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.2)
    assert httpx.get(f"{g.gateway.url}/t/x/v1/models").status_code == 401  # room again


def test_the_call_cap_counts_from_the_first_byte(make):
    g = make(max_concurrent_calls=2)
    base, headers = g.open("cap/0")
    path = base.split(str(g.gateway.port), 1)[1]
    stalled = []
    try:
        for _ in range(2):  # two calls that send their headers and hold their bodies
            sock = g.raw()
            sock.sendall(f"POST {path}/chat/completions HTTP/1.1\r\nhost: a\r\nauthorization: "
                         f"{headers['authorization']}\r\ncontent-length: 300000\r\n\r\n{{".encode())
            stalled.append(sock)
        time.sleep(0.3)
        r = httpx.post(f"{base}/chat/completions", headers=headers,
                       json={"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 429 and r.json()["error"]["code"] == "too_many_calls"  # 200 on main
    finally:
        for sock in stalled:
            sock.close()


def test_without_its_key_no_answer_tells_which_ids_exist(make):
    g = make()
    base, headers = g.open("real/0")
    answers = set()
    for tid in ("real/0", "never/0"):
        r = httpx.get(g.gateway.base_url(tid) + "/models", headers={"authorization": "Bearer guess"})
        answers.add((r.status_code, r.json()["error"]["code"]))
    assert answers == {(401, "invalid_api_key")}  # main: 401 for the real id, 404 for the other


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


FLOOD = """
import json, sys, threading, httpx
url, auth = sys.argv[1], sys.argv[2]
body = json.dumps({"model": "m", "messages": [{"role": "user", "content": "word " * 700_000}]}).encode()
def send():
    with httpx.Client(timeout=60) as client:
        for _ in range(3):
            assert client.post(url, content=body, headers={"authorization": auth}).status_code == 400
threads = [threading.Thread(target=send) for _ in range(20)]
[t.start() for t in threads]
[t.join() for t in threads]
"""


def test_memory_goes_back_after_large_bodies(make, tmp_path):
    g = make(max_concurrent_calls=64)
    base, headers = g.open("mem/0", max_total_tokens=65536)  # a context a 3.5 MB body might fit: it is read
    (tmp_path / "flood.py").write_text(FLOOD)
    time.sleep(0.3)
    before = _rss_mb()
    # 60 bodies of 3.5 MB, 20 at once, from another process (only the gateway's memory is measured here)
    subprocess.run([sys.executable, str(tmp_path / "flood.py"), f"{base}/chat/completions",
                    headers["authorization"]], check=True, timeout=300)
    deadline = time.monotonic() + 5
    while _rss_mb() > before + 10 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _rss_mb() <= before + 10, (before, _rss_mb())  # +18 MB kept here without malloc_trim
