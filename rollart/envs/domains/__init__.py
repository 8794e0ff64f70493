"""Built-in task domains: frozenlake, sokoban, math, code, swe (SWE-style repair in a workspace sandbox: the
`swe/` package) and guess_number (a GEM game with an expert).

Each module holds a seedable generator, a text renderer, an action parser, the env class (GEM interface
plus `expert_action()` and `random_action()`), and needs no download. Splits come from seed ranges
(`rollart.envs.seeds`).
"""
