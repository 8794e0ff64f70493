"""The planner: pool sizes and the domain → pool mapping chosen with the cluster twin (`rollart plan`)."""

from rollart.plan.outputs import ray_start_lines, raycluster_manifest, run_yaml
from rollart.plan.search import Candidate, Plan, candidates, estimate, plan

__all__ = ["Candidate", "Plan", "candidates", "estimate", "plan", "ray_start_lines", "raycluster_manifest", "run_yaml"]
