"""vf_lookup: answer with what a tool returns (tool-using, multi-turn), written as verifiers' v1 docs show a
taskset with a task-scoped `vf.Toolset` — on local task data (servers/facts.json).

The model must call `facts_lookup` and reply with what it returns inside <answer></answer>; the reward is 1.0
when the fact appears in its last reply.
"""

import verifiers.v1 as vf
from vf_lookup.servers.facts import FACTS, FactsToolset


class LookupTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class LookupData(vf.TaskData):
    answer: str
    """The fact the `lookup` tool returns for this task's entity."""


class LookupTask(vf.Task[LookupData, vf.State, LookupTaskConfig]):
    @classmethod
    def toolsets(cls, config: LookupTaskConfig) -> list[vf.Toolset]:
        return [FactsToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def looked_up(self, trace: vf.Trace) -> float:
        return float(self.data.answer.lower() in (trace.last_reply or "").lower())


class LookupConfig(vf.TasksetConfig):
    task: LookupTaskConfig = LookupTaskConfig()


class LookupTaskset(vf.Taskset[LookupTask, LookupConfig]):
    def load(self) -> list[LookupTask]:
        return [
            LookupTask(
                LookupData(
                    idx=i,
                    name=entity.title(),
                    prompt=(f'Use the `facts_lookup` tool to look up "{entity.title()}", then reply with exactly what '
                            "it returns inside <answer></answer> tags."),
                    answer=fact,
                ),
                self.config.task,
            )
            for i, (entity, fact) in enumerate(FACTS.items())
        ]
