from vf_lookup.taskset import LookupTaskset

__all__ = ["LookupTaskset"]
