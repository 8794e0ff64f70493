"""The functions a generated repair task's package is made of: templates with seed-drawn constants.

In: a `random.Random`. Out: for each `Template`, the source of one pure function (`source(rng)`, a `def`
with its docstring) and argument tuples to test it on (`cases(rng)`). A template may call others (`calls`):
the package then holds them too, imported by the caller's module.

Guarantees (what the mutations and the expert rely on): every function terminates on every input whatever
one mutation does to it (no `while`, no recursion; loops run over their arguments), returns a value whose
`repr` is a Python literal (ints, strings, bools, lists, tuples), and names are unique across templates.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable

Args = tuple[Any, ...]


@dataclass(frozen=True)
class Template:
    name: str
    topic: str  # the module it lives in
    summary: str  # what it does, in words (the issue text names it)
    source: Callable[[random.Random], str]
    cases: Callable[[random.Random], list[Args]]
    calls: tuple[str, ...] = ()


def _ints(rng: random.Random, n: int, lo: int = -20, hi: int = 20) -> list[int]:
    return [rng.randint(lo, hi) for _ in range(n)]


def _lists(rng: random.Random, count: int = 8, lo: int = -9, hi: int = 9, min_len: int = 0,
           max_len: int = 7) -> list[list[int]]:
    return [[rng.randint(lo, hi) for _ in range(rng.randint(min_len, max_len))] for _ in range(count)]


WORDS = ("apple", "lake", "rollart", "box", "level", "noon", "tree", "Queue", "sky", "idea", "Ohio", "radar")


def _phrases(rng: random.Random, count: int = 8) -> list[str]:
    return [" ".join(rng.sample(WORDS, rng.randint(0, 4))) for _ in range(count)]


# --- numbers -------------------------------------------------------------------------------------------

def _clamp(rng: random.Random) -> str:
    return (
        "def clamp(x, lo, hi):\n"
        "    '''x limited to the range [lo, hi].'''\n"
        "    if x < lo:\n        return lo\n"
        "    if x > hi:\n        return hi\n"
        "    return x\n"
    )


def _clamp_cases(rng: random.Random) -> list[Args]:
    out = []
    for _ in range(8):
        lo = rng.randint(-10, 5)
        hi = lo + rng.randint(0, 10)
        out.append((rng.choice([lo - 1 - rng.randint(0, 3), lo, hi, hi + 1 + rng.randint(0, 3),
                                rng.randint(lo, hi)]), lo, hi))
    return out


def _sign(rng: random.Random) -> str:
    return (
        "def sign(x):\n"
        "    '''-1, 0 or 1: the sign of x.'''\n"
        "    if x > 0:\n        return 1\n"
        "    if x < 0:\n        return -1\n"
        "    return 0\n"
    )


def _digit_sum(rng: random.Random) -> str:
    return (
        "def digit_sum(n):\n"
        "    '''The sum of the decimal digits of abs(n).'''\n"
        "    total = 0\n"
        "    for ch in str(abs(n)):\n"
        "        total += int(ch)\n"
        "    return total\n"
    )


def _percent(rng: random.Random) -> str:
    return (
        "def percent(part, whole):\n"
        "    '''part as a whole percentage of whole, rounded down; 0 when whole is 0.'''\n"
        "    if whole == 0:\n        return 0\n"
        "    return part * 100 // whole\n"
    )


def _percent_cases(rng: random.Random) -> list[Args]:
    out: list[Args] = [(rng.randint(0, 9), 0)]
    for _ in range(7):
        whole = rng.randint(1, 40)
        out.append((rng.randint(0, whole), whole))
    return out


def _bonus(rng: random.Random) -> str:
    k, a, b = rng.randint(5, 15), rng.randint(2, 4), rng.randint(1, 9)
    return (
        "def bonus(points):\n"
        f"    '''Points above {k} are multiplied by {a}; others get {b} added.'''\n"
        f"    if points > {k}:\n        return points * {a}\n"
        f"    return points + {b}\n"
    )


def _round_to(rng: random.Random) -> str:
    return (
        "def round_to(x, step):\n"
        "    '''The multiple of step nearest to x (halves round up), for x >= 0 and step >= 1.'''\n"
        "    return (x + step // 2) // step * step\n"
    )


def _round_to_cases(rng: random.Random) -> list[Args]:
    return [(rng.randint(0, 60), rng.randint(2, 10)) for _ in range(8)]


# --- sequences -----------------------------------------------------------------------------------------

def _count_above(rng: random.Random) -> str:
    return (
        "def count_above(xs, k):\n"
        "    '''How many items of xs are strictly greater than k.'''\n"
        "    count = 0\n"
        "    for x in xs:\n"
        "        if x > k:\n            count += 1\n"
        "    return count\n"
    )


def _running_total(rng: random.Random) -> str:
    return (
        "def running_total(xs):\n"
        "    '''The prefix sums of xs: [xs[0], xs[0] + xs[1], ...].'''\n"
        "    out = []\n"
        "    total = 0\n"
        "    for x in xs:\n"
        "        total = total + x\n"
        "        out.append(total)\n"
        "    return out\n"
    )


def _chunk(rng: random.Random) -> str:
    return (
        "def chunk(xs, n):\n"
        "    '''xs cut into consecutive lists of n items (the last may be shorter), n >= 1.'''\n"
        "    return [xs[i:i + n] for i in range(0, len(xs), n)]\n"
    )


def _dedupe(rng: random.Random) -> str:
    return (
        "def dedupe(xs):\n"
        "    '''The items of xs without repeats, in the order they first appear.'''\n"
        "    seen = []\n"
        "    for x in xs:\n"
        "        if x not in seen:\n            seen.append(x)\n"
        "    return seen\n"
    )


def _max_index(rng: random.Random) -> str:
    return (
        "def max_index(xs):\n"
        "    '''The index of the first largest item of xs; -1 for an empty list.'''\n"
        "    if len(xs) == 0:\n        return -1\n"
        "    best = 0\n"
        "    for i in range(1, len(xs)):\n"
        "        if xs[i] > xs[best]:\n            best = i\n"
        "    return best\n"
    )


def _pairwise_diff(rng: random.Random) -> str:
    return (
        "def pairwise_diff(xs):\n"
        "    '''The differences of neighbours: [xs[1] - xs[0], xs[2] - xs[1], ...].'''\n"
        "    return [b - a for a, b in zip(xs, xs[1:])]\n"
    )


def _rotate(rng: random.Random) -> str:
    return (
        "def rotate(xs, k):\n"
        "    '''xs rotated left by k places.'''\n"
        "    if not xs:\n        return []\n"
        "    k = k % len(xs)\n"
        "    return xs[k:] + xs[:k]\n"
    )


def _window_sums(rng: random.Random) -> str:
    return (
        "def window_sums(xs, w):\n"
        "    '''The sums of every run of w consecutive items of xs, w >= 1.'''\n"
        "    return [sum(xs[i:i + w]) for i in range(len(xs) - w + 1)]\n"
    )


def _list_and_small(rng: random.Random) -> list[Args]:
    return [(xs, rng.randint(1, 4)) for xs in _lists(rng, min_len=1)]


def _list_and_int(rng: random.Random) -> list[Args]:
    return [(xs, rng.randint(-5, 5)) for xs in _lists(rng)]


def _one_list(rng: random.Random) -> list[Args]:
    return [(xs,) for xs in _lists(rng)]


def _one_list_repeats(rng: random.Random) -> list[Args]:
    return [(xs,) for xs in _lists(rng, lo=0, hi=4)]


# --- text ----------------------------------------------------------------------------------------------

def _pad_left(rng: random.Random) -> str:
    fill = rng.choice("0.*_")
    return (
        "def pad_left(s, width):\n"
        f"    '''s padded on the left with {fill!r} to at least width characters.'''\n"
        "    missing = width - len(s)\n"
        "    if missing > 0:\n"
        f"        return {fill!r} * missing + s\n"
        "    return s\n"
    )


def _pad_cases(rng: random.Random) -> list[Args]:
    return [(rng.choice(WORDS)[: rng.randint(0, 6)], rng.randint(0, 9)) for _ in range(8)]


def _count_vowels(rng: random.Random) -> str:
    return (
        "def count_vowels(s):\n"
        "    '''How many letters of s are vowels (a, e, i, o, u; either case).'''\n"
        "    count = 0\n"
        "    for ch in s.lower():\n"
        "        if ch in 'aeiou':\n            count += 1\n"
        "    return count\n"
    )


def _capitalize_words(rng: random.Random) -> str:
    return (
        "def capitalize_words(s):\n"
        "    '''s with the first letter of every space-separated word in upper case.'''\n"
        "    return ' '.join(w[:1].upper() + w[1:] for w in s.split(' '))\n"
    )


def _is_palindrome(rng: random.Random) -> str:
    return (
        "def is_palindrome(s):\n"
        "    '''Whether s reads the same backwards, ignoring case and spaces.'''\n"
        "    t = s.replace(' ', '').lower()\n"
        "    return t == t[::-1]\n"
    )


def _palindrome_cases(rng: random.Random) -> list[Args]:
    return [(w,) for w in rng.sample(WORDS, 6)] + [("Never odd or even",), ("ab ba c",)]


def _truncate(rng: random.Random) -> str:
    return (
        "def truncate(s, n):\n"
        "    '''s cut to at most n characters, the last three of them '...' when it was cut (n >= 3).'''\n"
        "    if len(s) <= n:\n        return s\n"
        "    return s[:n - 3] + '...'\n"
    )


def _truncate_cases(rng: random.Random) -> list[Args]:
    return [(p, rng.randint(3, 14)) for p in _phrases(rng)]


def _initials(rng: random.Random) -> str:
    return (
        "def initials(name):\n"
        "    '''The upper-case first letters of the words of name, joined by dots: \"ada love\" -> \"A.L\".'''\n"
        "    return '.'.join(w[0].upper() for w in name.split())\n"
    )


def _word_lengths(rng: random.Random) -> str:
    return (
        "def word_lengths(s):\n"
        "    '''The length of each whitespace-separated word of s.'''\n"
        "    return [len(w) for w in s.split()]\n"
    )


def _one_phrase(rng: random.Random) -> list[Args]:
    return [(p,) for p in _phrases(rng)]


# --- stats (call numbers and sequences) ----------------------------------------------------------------

def _mean_int(rng: random.Random) -> str:
    return (
        "def mean_int(xs):\n"
        "    '''The mean of xs rounded down; 0 for an empty list.'''\n"
        "    if len(xs) == 0:\n        return 0\n"
        "    return sum(xs) // len(xs)\n"
    )


def _spread(rng: random.Random) -> str:
    return (
        "def spread(xs):\n"
        "    '''The largest item of xs minus the smallest; 0 for an empty list.'''\n"
        "    if not xs:\n        return 0\n"
        "    return max(xs) - min(xs)\n"
    )


def _median_low(rng: random.Random) -> str:
    return (
        "def median_low(xs):\n"
        "    '''The lower median of the non-empty list xs.'''\n"
        "    ordered = sorted(xs)\n"
        "    return ordered[(len(ordered) - 1) // 2]\n"
    )


def _grade(rng: random.Random) -> str:
    a = rng.randint(85, 95)
    b = a - rng.randint(8, 15)
    return (
        "def grade(score):\n"
        f"    '''A for a score of at least {a}, B for at least {b}, else C.'''\n"
        f"    if score >= {a}:\n        return 'A'\n"
        f"    if score >= {b}:\n        return 'B'\n"
        "    return 'C'\n"
    )


def _grade_cases(rng: random.Random) -> list[Args]:
    return [(rng.randint(60, 100),) for _ in range(10)]


def _clipped_mean(rng: random.Random) -> str:
    return (
        "def clipped_mean(xs, lo, hi):\n"
        "    '''The mean (rounded down) of xs after limiting each item to [lo, hi].'''\n"
        "    return mean_int([clamp(x, lo, hi) for x in xs])\n"
    )


def _clipped_cases(rng: random.Random) -> list[Args]:
    return [(xs, -3, 4) for xs in _lists(rng)]


def _top_k_sum(rng: random.Random) -> str:
    return (
        "def top_k_sum(xs, k):\n"
        "    '''The sum of the k largest items of xs.'''\n"
        "    return sum(sorted(xs, reverse=True)[:k])\n"
    )


def _trend(rng: random.Random) -> str:
    return (
        "def trend(xs):\n"
        "    '''How many neighbour steps of xs go up minus how many go down.'''\n"
        "    return sum(sign(d) for d in pairwise_diff(xs))\n"
    )


def _grade_mean(rng: random.Random) -> str:
    return (
        "def grade_mean(scores):\n"
        "    '''The grade of the mean (rounded down) of scores.'''\n"
        "    return grade(mean_int(scores))\n"
    )


def _scores_cases(rng: random.Random) -> list[Args]:
    return [([rng.randint(60, 100) for _ in range(rng.randint(1, 5))],) for _ in range(8)]


TEMPLATES: tuple[Template, ...] = (
    Template("clamp", "numbers", "limits a number to a range", _clamp, _clamp_cases),
    Template("sign", "numbers", "gives the sign of a number", _sign, lambda r: [(x,) for x in _ints(r, 6) + [0, 1]]),
    Template("digit_sum", "numbers", "sums the digits of a number", _digit_sum,
             lambda r: [(x,) for x in _ints(r, 8, -999, 999)]),
    Template("percent", "numbers", "turns a part of a whole into a percentage", _percent, _percent_cases),
    Template("bonus", "numbers", "computes bonus points", _bonus, lambda r: [(x,) for x in _ints(r, 10, 0, 25)]),
    Template("round_to", "numbers", "rounds to the nearest multiple of a step", _round_to, _round_to_cases),
    Template("count_above", "sequences", "counts the items above a bound", _count_above, _list_and_int),
    Template("running_total", "sequences", "computes prefix sums", _running_total, _one_list),
    Template("chunk", "sequences", "cuts a list into chunks", _chunk, _list_and_small),
    Template("dedupe", "sequences", "drops repeated items", _dedupe, _one_list_repeats),
    Template("max_index", "sequences", "finds where the largest item is", _max_index, _one_list_repeats),
    Template("pairwise_diff", "sequences", "computes differences of neighbours", _pairwise_diff, _one_list),
    Template("rotate", "sequences", "rotates a list", _rotate, _list_and_int),
    Template("window_sums", "sequences", "sums sliding windows", _window_sums, _list_and_small),
    Template("pad_left", "text", "pads a string on the left", _pad_left, _pad_cases),
    Template("count_vowels", "text", "counts vowels", _count_vowels, _one_phrase),
    Template("capitalize_words", "text", "capitalizes words", _capitalize_words, _one_phrase),
    Template("is_palindrome", "text", "tells palindromes apart", _is_palindrome, _palindrome_cases),
    Template("truncate", "text", "shortens long strings", _truncate, _truncate_cases),
    Template("initials", "text", "makes initials from a name", _initials, _one_phrase),
    Template("word_lengths", "text", "measures words", _word_lengths, _one_phrase),
    Template("mean_int", "stats", "computes a mean", _mean_int, _one_list),
    Template("spread", "stats", "computes the range of a list", _spread, _one_list),
    Template("median_low", "stats", "computes a median", _median_low,
             lambda r: [(xs,) for xs in _lists(r, min_len=1)]),
    Template("grade", "stats", "grades a score", _grade, _grade_cases),
    Template("clipped_mean", "stats", "averages clipped values", _clipped_mean, _clipped_cases,
             calls=("clamp", "mean_int")),
    Template("top_k_sum", "stats", "sums the largest items", _top_k_sum, _list_and_small),
    Template("trend", "stats", "measures the trend of a series", _trend, _one_list, calls=("sign", "pairwise_diff")),
    Template("grade_mean", "stats", "grades a mean score", _grade_mean, _scores_cases, calls=("grade", "mean_int")),
)
BY_NAME: dict[str, Template] = {t.name: t for t in TEMPLATES}
TOPICS: tuple[str, ...] = ("numbers", "sequences", "text", "stats")
