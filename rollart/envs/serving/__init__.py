"""The env plane's HTTP side: env servers and what the servers (the env server, the agent gateway) share.

- `server`: one domain's environments over HTTP (`rollart env serve`), for `remote:` envs elsewhere.
- `fleet`: env servers rollart runs itself (`domains.<d>.env_servers`), kept whole by the resource plane.
- `http_serving`: a Starlette app on uvicorn on a thread of its own, request bodies read within a bound.
- `http_guard`: connection limits below the app (connection cap, slow heads, header size).
"""
