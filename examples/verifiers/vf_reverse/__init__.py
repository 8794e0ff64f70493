from vf_reverse.taskset import ReverseTaskset

__all__ = ["ReverseTaskset"]
