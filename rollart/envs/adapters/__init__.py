"""Env kinds that bring someone else's environment: each turns a spec into rollart's env protocol, one file each,
registered by one line in `ADAPTERS` (rollart/envs/spec.py; its docstring says what an adapter class provides).

- `gym`: `gym:<id>`, a gymnasium env with a discrete action space, played through text.
- `gem`: `gem:<id>`, any GEM (`gem-llm`) environment.
- `remote`: `remote:<url>`, the envs an env server (`rollart env serve`) serves.
- `reasoning_gym`: `reasoning_gym:<dataset>`, a reasoning-gym task generator scored by its own `score_answer`.
- `user_object`: the importer for a user's `module.path:attr` (env classes, agent functions, dataset episodes).
"""
