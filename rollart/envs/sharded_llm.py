"""`ShardedLLMClient`: the `LLMClient` over N LLM-proxy shards — each trajectory's calls go to its group's shard.

In: one `LLMClient` per proxy shard (env workers wrap each shard's actor handle in an `ActorLLMClient`), in shard
order. Out: `generate(request)` and `abort(trajectory_id)` on the shard `rollart.base.proxy_shard` picks for the
trajectory id.

Guarantees: every turn and every abort of a trajectory reach the same shard — the one holding its sticky
routing and its abort — and every member of a group reaches that shard too, so the group's prompt prefix is
routed by one proxy (inference.proxy_shards). Env managers and the agent gateway both generate through the
worker's one client, so both are sharded alike. Picklable when its clients are.
"""

from __future__ import annotations

from typing import Sequence

from rollart.base.proxy_shard import proxy_shard
from rollart.types import GenerationRequest, GenerationResult, LLMClient


class ShardedLLMClient:
    def __init__(self, shards: Sequence[LLMClient]) -> None:
        if not shards:
            raise ValueError("ShardedLLMClient needs at least one proxy shard")
        self.shards = list(shards)

    def shard_of(self, trajectory_id: str) -> LLMClient:
        return self.shards[proxy_shard(trajectory_id, len(self.shards))]

    async def generate(self, request: GenerationRequest) -> GenerationResult:
        return await self.shard_of(request.trajectory_id).generate(request)

    async def abort(self, trajectory_id: str) -> None:
        await self.shard_of(trajectory_id).abort(trajectory_id)
