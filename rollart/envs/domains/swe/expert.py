"""The scripted expert of the SWE repair domain: it knows the seeded bug and writes the fix as a patch.

In: a `RepairTask`. Out: `expert_patch(task)`, the unified diff that turns the buggy file back into the
correct one. Guarantee (tested on 200 generated tasks at every difficulty): applied with `apply_patch`, it
makes every hidden case pass. The env turns it into tool calls for warm-start demonstrations.
"""

from __future__ import annotations

from rollart.envs.domains.swe.generator import RepairTask
from rollart.envs.domains.swe.patch import make_patch


def expert_patch(task: RepairTask) -> str:
    path = task.bug.path
    return make_patch(path, task.files[path], task.fix[path])
