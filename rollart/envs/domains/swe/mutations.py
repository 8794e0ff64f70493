"""Seeded bugs: one small change to one function, from a family of mutations (AST in, source out).

In: the source of one function (as `ast.unparse` writes it) and the families to draw from. Out: every
single-site `Mutation` of it — the family, a one-line description and the mutated function's source — in a
stable order (`ast.walk`'s), so a seeded shuffle picks the same bug on every machine.

Families (the slips people make):
- `arithmetic`: `+`↔`-`, `*`→`+`, `//`→`*`, `%`→`//`, also in augmented assignments (`+=`);
- `comparison`: `<`↔`<=`, `>`↔`>=`, `==`↔`!=`, `in`↔`not in`;
- `off_by_one`: an integer literal one more or one less;
- `boolean`: a `not` dropped, `and`↔`or`, `True`↔`False`;
- `swap`: the first two arguments of a call, or the operands of a non-commutative operator, swapped;
- `wrong_variable`: a variable read where another of the function's variables was meant.

Guarantee: a mutant differs from the original in the mutated node only, so after `ast.unparse` of both
the change is one line (or the lines of one statement). Whether a mutant is observable is the generator's
to check (it runs both on the test cases): some are equivalent on every input.
"""

from __future__ import annotations

import ast
import copy
import functools
from dataclasses import dataclass, field
from typing import Callable, Iterator

FAMILIES: tuple[str, ...] = ("arithmetic", "comparison", "off_by_one", "boolean", "swap", "wrong_variable")

_ARITH: dict[type, type] = {ast.Add: ast.Sub, ast.Sub: ast.Add, ast.Mult: ast.Add, ast.FloorDiv: ast.Mult,
                            ast.Mod: ast.FloorDiv}
_COMPARE: dict[type, type] = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt,
                              ast.Eq: ast.NotEq, ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In}
_SYMBOL: dict[type, str] = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.FloorDiv: "//", ast.Mod: "%",
                            ast.Lt: "<", ast.LtE: "<=", ast.Gt: ">", ast.GtE: ">=", ast.Eq: "==",
                            ast.NotEq: "!=", ast.In: "in", ast.NotIn: "not in", ast.And: "and", ast.Or: "or"}
_NON_COMMUTATIVE = (ast.Sub, ast.FloorDiv, ast.Mod)


@dataclass(frozen=True)
class Mutation:
    family: str
    description: str
    build: Callable[[], str] = field(repr=False, compare=False)

    @functools.cached_property
    def source(self) -> str:
        """The mutated function."""
        return self.build()


# an edit: (family, description, a function that changes the node of that index in a copy of the tree)
Edit = tuple[str, str, Callable[[ast.AST], ast.AST | None]]


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                ids.update(id(n) for n in ast.walk(first))
    return ids


def _variables(tree: ast.AST) -> list[str]:
    """The function's arguments and the names it assigns, in order of first appearance."""
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) or (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store)):
            name = node.arg if isinstance(node, ast.arg) else node.id
            if name not in names:
                names.append(name)
    return names


def _fixed_names(tree: ast.AST) -> set[int]:
    """Names `wrong_variable` leaves alone: what a loop iterates over and the object a method is called on
    (`for x in xs: out.append(x)` → `xs.append(x)` would grow the list it walks, forever)."""
    ids: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.For, ast.comprehension)):
            ids.update(id(n) for n in ast.walk(node.iter))
        elif isinstance(node, ast.Attribute):
            ids.add(id(node.value))
    return ids


def _edits(node: ast.AST, variables: list[str]) -> Iterator[Edit]:
    """The mutations possible at one node, each as an in-place edit of a copy of that node."""
    if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _ARITH:
        old, new = type(node.op), _ARITH[type(node.op)]

        def set_op(n: ast.AST, new: type = new) -> None:
            n.op = new()  # type: ignore[attr-defined]

        yield "arithmetic", f"'{_SYMBOL[old]}' became '{_SYMBOL[new]}'", set_op
    if isinstance(node, ast.BinOp) and isinstance(node.op, _NON_COMMUTATIVE):
        def swap_operands(n: ast.AST) -> None:
            n.left, n.right = n.right, n.left  # type: ignore[attr-defined]

        yield "swap", f"the operands of '{_SYMBOL[type(node.op)]}' were swapped", swap_operands
    if isinstance(node, ast.Compare) and len(node.ops) == 1 and type(node.ops[0]) in _COMPARE:
        old, new = type(node.ops[0]), _COMPARE[type(node.ops[0])]

        def set_compare(n: ast.AST, new: type = new) -> None:
            n.ops = [new()]  # type: ignore[attr-defined]

        yield "comparison", f"'{_SYMBOL[old]}' became '{_SYMBOL[new]}'", set_compare
    if isinstance(node, ast.Constant) and type(node.value) is int:
        for delta in (1, -1):
            def shift(n: ast.AST, delta: int = delta) -> None:
                n.value += delta  # type: ignore[attr-defined]

            yield "off_by_one", f"the literal {node.value} became {node.value + delta}", shift
    if isinstance(node, ast.Constant) and type(node.value) is bool:
        def negate(n: ast.AST) -> None:
            n.value = not n.value  # type: ignore[attr-defined]

        yield "boolean", f"the literal {node.value} became {not node.value}", negate
    if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in variables:
        for other in variables:
            if other != node.id:
                def rename(n: ast.AST, other: str = other) -> None:
                    n.id = other  # type: ignore[attr-defined]

                yield "wrong_variable", f"'{other}' is read where '{node.id}' was meant", rename
    if isinstance(node, ast.BoolOp):
        new_bool = ast.Or if isinstance(node.op, ast.And) else ast.And

        def flip(n: ast.AST, new_bool: type = new_bool) -> None:
            n.op = new_bool()  # type: ignore[attr-defined]

        yield "boolean", f"'{_SYMBOL[type(node.op)]}' became '{_SYMBOL[new_bool]}'", flip
    if isinstance(node, ast.Call) and len(node.args) >= 2 and ast.dump(node.args[0]) != ast.dump(node.args[1]):
        def swap_args(n: ast.AST) -> None:
            n.args[0], n.args[1] = n.args[1], n.args[0]  # type: ignore[attr-defined]

        yield "swap", "the first two arguments of a call were swapped", swap_args


class _DropNot(ast.NodeTransformer):
    def __init__(self, target: int) -> None:
        self.target, self.index = target, -1

    def visit_UnaryOp(self, node: ast.UnaryOp) -> ast.AST:
        self.index += 1
        if self.index == self.target:
            return self.generic_visit(node).operand  # type: ignore[attr-defined]
        return self.generic_visit(node)


def mutations(function_source: str, families: tuple[str, ...] = FAMILIES) -> list[Mutation]:
    """Every single-site mutation of `function_source` in `families`, in a stable order (each mutant's
    source is built when first read: a generator tries a few of many)."""
    unknown = set(families) - set(FAMILIES)
    if unknown or not families:
        raise ValueError(f"swe: mutation families must be a non-empty subset of {list(FAMILIES)}, got {list(families)}")
    tree = ast.parse(function_source)
    skip = _docstring_nodes(tree)
    variables = _variables(tree)
    fixed = _fixed_names(tree)
    out: list[Mutation] = []
    nodes = [n for n in ast.walk(tree) if id(n) not in skip]
    for index, node in enumerate(nodes):
        for family, description, edit in _edits(node, [] if id(node) in fixed else variables):
            if family in families:
                out.append(Mutation(family, description, functools.partial(_edited, tree, index, edit)))
    if "boolean" in families:
        nots = [n for n in ast.walk(tree) if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.Not)]
        for k in range(len(nots)):
            out.append(Mutation("boolean", "a 'not' was dropped",
                                functools.partial(lambda k: ast.unparse(_DropNot(k).visit(copy.deepcopy(tree))), k)))
    return out


def _edited(tree: ast.AST, index: int, edit: Callable[[ast.AST], ast.AST | None]) -> str:
    """The source of `tree` with `edit` applied to its `index`-th node (docstrings not counted)."""
    mutant = copy.deepcopy(tree)
    skip = _docstring_nodes(mutant)
    edit([n for n in ast.walk(mutant) if id(n) not in skip][index])
    return ast.unparse(mutant)
