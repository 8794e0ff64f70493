"""mini-swe-agent (from PyPI, unchanged) as a rollart agent on the SWE repair domain:

    domains:
      swe_mini: {agent: mini_swe_agent:run, options: {difficulty: 0, max_calls: 6}}

mini-swe-agent's own `DefaultAgent` with its own model class (`LitellmModel`: LiteLLM's chat completions with
its `bash` tool) and its own prompts (its `default.yaml`) talks to the trajectory's gateway; what is ours is
its `Environment`: `WorkspaceEnvironment` runs each command in the trajectory's own workspace sandbox (the
SWE domain's `SweEnv`: its own uid, no network, limits), never on the host, and maps mini-swe-agent's
submission (`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT`) onto the domain's `submit`, which the hidden tests
score. The reward is that score. `run` is a plain `def` (mini-swe-agent is synchronous; rollart runs it in a
thread), and the workspace is closed whatever happens.
"""

from __future__ import annotations

import os
import platform
from typing import Any

os.environ.setdefault("MSWEA_SILENT_STARTUP", "1")  # mini-swe-agent prints a banner on import otherwise
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # LiteLLM fetches a price list at import otherwise

import yaml  # noqa: E402
from minisweagent.agents.default import DefaultAgent  # noqa: E402
from minisweagent.config import get_config_path  # noqa: E402
from minisweagent.exceptions import Submitted  # noqa: E402
from minisweagent.models.litellm_model import LitellmModel  # noqa: E402

from rollart.envs.domains.swe.env import SweEnv  # noqa: E402

SUBMIT = "COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


class WorkspaceEnvironment:
    """mini-swe-agent's `Environment` protocol over a `SweEnv`'s workspace sandbox."""

    def __init__(self, env: SweEnv) -> None:
        self.env, self.config, self.reward = env, {}, 0.0

    def execute(self, action: dict, cwd: str = "", *, timeout: int | None = None) -> dict[str, Any]:
        command = str(action.get("command", ""))
        if command.strip().startswith("echo") and SUBMIT in command:
            verdict, self.reward, _, _, _ = self.env.call_tool("submit", {})
            raise Submitted({"role": "exit", "content": verdict,
                             "extra": {"exit_status": "Submitted", "submission": verdict}})
        text, _, _, _, _ = self.env.call_tool("bash", {"command": command})
        status, _, output = text.partition("\n")  # "[exit code N]" (or "[timed out]") then the output
        code = int(status[len("[exit code "):-1]) if status.startswith("[exit code ") else -1
        return {"output": output, "returncode": code, "exception_info": "" if code >= 0 else status}

    def get_template_vars(self, **kwargs: Any) -> dict[str, Any]:
        # its prompts name the system the commands run on: the sandbox runs them on this machine's kernel
        return {**platform.uname()._asdict(), "cwd": ".", **kwargs}

    def serialize(self) -> dict[str, Any]:
        return {"info": {"environment_type": "rollart SweEnv workspace"}}


def run(base_url: str, api_key: str, task) -> dict:
    options = dict(task.options)
    env = SweEnv(**{k: v for k, v in options.items() if k != "max_calls"})
    try:
        issue, _ = env.reset(task.seed)
        config = yaml.safe_load(get_config_path("default").read_text())
        model = LitellmModel(model_name=f"openai/{task.model}", cost_tracking="ignore_errors",
                             model_kwargs={"api_base": base_url, "api_key": api_key},  # length: the domain caps it
                             **{k: v for k, v in config["model"].items() if k not in ("model_name", "model_kwargs")})
        environment = WorkspaceEnvironment(env)
        agent = DefaultAgent(model, environment, **{**config["agent"], "step_limit": int(options.get("max_calls", 6)),
                                                    "cost_limit": 0.0})
        info = agent.run(issue)
        return {"reward": environment.reward, "metrics": {"submitted": float(info.get("exit_status") == "Submitted"),
                                                          "steps": float(agent.n_calls)}}
    finally:
        env.close()
