"""`rollart env play` of an env kind that runs as an agent (`verifiers:<taskset>`): you are the model.

The episode runs as in training — the adapter's `run(base_url, api_key, task)` against a real `AgentGateway`
session, driven by an `AgentManager` — over the built-in tiny tokenizer (with tool-call tokens), but each model
call is answered by you: the new part of the prompt is printed and your answer (from `--actions 'a;b'` or the
prompt) is the model's whole reply, as the gateway then parses it (a tool call is written
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`). There is no expert or random policy for such a kind
(verifiers has no oracle): `--policy model --model RUN_DIR` lets a trained model play instead.
"""

from __future__ import annotations

import argparse
from typing import Any

EXIT_BAD_SPEC = 2


async def play_agent(args: argparse.Namespace, options: dict[str, Any]) -> int:
    import sys

    from rollart.config import DomainConfig
    from rollart.envs.agents.gateway import AgentGateway
    from rollart.envs.agents.manager import AgentManager
    from rollart.envs.chat import ChatTokens
    from rollart.envs.spec import EnvSpecError, adapter_agent
    from rollart.models.tiny import build_tokenizer
    from rollart.types import GenerationResult, SamplingParams, Task

    if args.policy:
        print(f"rollart: {args.spec} has no {args.policy} policy (verifiers has no oracle); give --actions, answer "
              "at the prompt, or let a trained model play (--policy model --model RUN_DIR)", file=sys.stderr)
        return EXIT_BAD_SPEC
    domain = DomainConfig(env=args.spec, options=options, max_turns=args.max_turns, max_new_tokens=4096,
                          max_total_tokens=1 << 16)
    try:
        agent = adapter_agent(domain)
    except (EnvSpecError, ValueError) as exc:
        print(f"rollart: {exc}", file=sys.stderr)
        return EXIT_BAD_SPEC
    chat = ChatTokens(build_tokenizer(tool_calls=True))
    queue = [a.strip() for a in (args.actions or "").split(";") if a.strip()] if args.actions is not None else None
    shown = [0]

    class You:
        """The `LLMClient` whose answers are yours."""

        async def generate(self, request: Any) -> GenerationResult:
            text = chat.tokenizer.decode(list(request.prompt_token_ids))
            turn = int(request.request_id.rsplit("/", 1)[1]) + 1
            print(f"\n-- prompt {turn} (new part)\n{text[shown[0]:]}")
            if queue is not None:
                answer = queue.pop(0) if queue else ""
            else:
                try:
                    answer = input("reply> ")
                except EOFError:
                    answer = ""
            print(f"-- reply {turn}: {answer}")
            ids = list(chat.tokenizer.encode(answer, add_special_tokens=False)) + [chat.stop_token_ids[0]]
            shown[0] = len(text) + len(answer)
            return GenerationResult(request.request_id, request.trajectory_id, tuple(ids), tuple([0.0] * len(ids)),
                                    tuple([0] * len(ids)), "stop", len(request.prompt_token_ids), worker="play/you")

        async def abort(self, trajectory_id: str) -> None:
            pass

    gateway = AgentGateway(You(), chat).start()
    try:
        task = Task("play", "play", args.spec, args.seed, "play", split=args.split)
        print(f"== {args.spec}  seed {args.seed} ({args.split}): you are the model")
        manager = AgentManager(task, 0, agent=agent, domain_cfg=domain, gateway=gateway,
                               sampling=SamplingParams(max_new_tokens=4096, stop_token_ids=chat.stop_token_ids))
        trajectory = await manager.run()
    finally:
        gateway.stop()
    metrics = {k: v for k, v in trajectory.metrics.items() if k.startswith("agent/")}
    print(f"\n== end: {trajectory.status.name.lower()} ({trajectory.status_reason}); return "
          f"{trajectory.env_return:g} after {len(trajectory.turns)} model call(s) {metrics or ''}")
    return 0
