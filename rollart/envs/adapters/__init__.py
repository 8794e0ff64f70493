"""Env kinds that bring someone else's environment: each turns a spec into rollart's env protocol.

- `gym`: `gym:<id>`, a gymnasium env with a discrete action space, played through text.
- `gem`: `gem:<id>`, any GEM (`gem-llm`) environment.
- `remote`: `remote:<url>`, the envs an env server (`rollart env serve`) serves.
- `user_object`: the importer for a user's `module.path:attr` (env classes, agent functions, dataset episodes).

`rollart/envs/spec.py` maps a domain's `env` spec to one of them.
"""
