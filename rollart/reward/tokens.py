"""Bearer tokens of the reward service: the operator's secret, and per-job tokens derived from it.

- The service secret S: `RewardService(token=...)`, else the env var `reward.http.token_env`, else random.
- A job token: `rj1.<job>.<mac>`, `mac` = the first 32 hex digits of HMAC-SHA256(S, "rollart-reward-job:"
  + job), `job` = 1–64 of `[A-Za-z0-9_-]`. Whoever holds S issues them (`rollart serve-reward --issue-token
  JOB`; a job in the service's Ray cluster asks the service for one); the service checks them without
  storing anything, in constant time.

`principal(S, presented)` says who a request is: "" for S itself (the operator), the job's name for a valid
job token, None for anything else (401). The service keeps every job's idempotency keys apart by principal,
so one job can never replay, conflict with or poison another's through the service's HTTP endpoint. A
driver with access to the Ray cluster is trusted with everything (Ray's model: it can call the directory
and claim-book actors directly; docs/architecture.md §10).
"""

from __future__ import annotations

import hashlib
import hmac
import re

PREFIX = "rj1"
JOB_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def _mac(secret: str, job: str) -> str:
    return hmac.new(secret.encode(), f"rollart-reward-job:{job}".encode(), hashlib.sha256).hexdigest()[:32]


def issue(secret: str, job: str) -> str:
    """The job token of `job` under the service secret `secret`."""
    if not JOB_NAME.match(job):
        raise ValueError(f"job name {job!r}: use 1–64 letters, digits, '_' or '-'")
    return f"{PREFIX}.{job}.{_mac(secret, job)}"


def principal(secret: str, presented: str) -> str | None:
    """"" for the secret itself, the job name for a valid job token, else None."""
    if hmac.compare_digest(presented.encode(), secret.encode()):
        return ""
    parts = presented.split(".")
    if len(parts) == 3 and parts[0] == PREFIX and JOB_NAME.match(parts[1]):
        if hmac.compare_digest(parts[2].encode(), _mac(secret, parts[1]).encode()):
            return parts[1]
    return None
