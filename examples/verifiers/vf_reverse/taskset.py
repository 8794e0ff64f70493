"""vf_reverse: reverse a word character by character (single-turn), written as verifiers' v1 docs show a
taskset — here on local task data (words.txt beside this file) instead of a hub dataset.

The model answers inside <reversed></reversed>; the reward is the similarity (difflib's ratio) of its answer to
the reversed word, so partial answers earn partial credit.
"""

import re
from difflib import SequenceMatcher
from pathlib import Path

import verifiers.v1 as vf

SYSTEM = "Reverse the word character by character. Answer as <reversed>...</reversed>."
_TAG = re.compile(r"<reversed>(.*?)</reversed>", re.DOTALL)
WORDS = Path(__file__).with_name("words.txt")


class ReverseData(vf.TaskData):
    answer: str
    """The word reversed."""


class ReverseTask(vf.Task[ReverseData]):
    @vf.stop
    async def single_turn(self, trace: vf.Trace) -> bool:
        return trace.num_turns >= 1

    @vf.reward(weight=1.0)
    async def similarity(self, trace: vf.Trace) -> float:
        match = _TAG.search(trace.last_reply or "")
        answer = match.group(1).strip() if match else ""
        return SequenceMatcher(None, answer, self.data.answer).ratio()


class ReverseConfig(vf.TasksetConfig):
    words_file: str = str(WORDS)


class ReverseTaskset(vf.Taskset[ReverseTask, ReverseConfig]):
    def load(self) -> list[ReverseTask]:
        words = Path(self.config.words_file).read_text().split()
        return [
            ReverseTask(ReverseData(idx=i, prompt=word, system_prompt=SYSTEM, answer=word[::-1]), self.config.task)
            for i, word in enumerate(words)
        ]
