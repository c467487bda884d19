"""A seeded mutation engine: bytes, lines, and the parsed JSON or YAML tree of a seed.

Each draw picks a real input and stacks a few mutations on it, as AFL's havoc stage does:
bit flips, byte inserts and deletes, chunk duplication, splicing with another seed,
numbers replaced by NaN, ±Inf, -1, 1e308 or integers of hundreds of digits, nesting far
past any recursion limit, bytes that are not UTF-8, truncation, line and label edits. A
structured seed (JSON or YAML) is also mutated as a tree, so that most mutants still
parse and reach the checks behind the syntax: a value of the wrong type or range, a key
missing, unknown or duplicated.

Everything takes a `random.Random`: a run is reproduced by its seed, and under
hypothesis (`st.randoms()`) a failing input shrinks to fewer, smaller mutations.
"""

from __future__ import annotations

import copy
import json
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import yaml

# Numbers a parser must read as unknown or refuse, never as a plain value.
HOSTILE_NUMBERS = (
    b"NaN", b"nan", b"-nan", b"Infinity", b"-Infinity", b"inf", b"-inf", b"+Inf", b".inf",
    b"-.inf", b".nan", b"-1", b"-0", b"0", b"-0.0", b"1e308", b"-1e308", b"1e309",
    b"4.9e-324", b"1e-320", b"99999999999999999999", b"1" + b"0" * 400, b"9" * 4400,
    b"9223372036854775808", b"-9223372036854775809", b"4294967296", b"1e12", b"0x10",
    b"1_000", b"1e", b"--1", b"1.5.5", b"\xd9\xa1",
)  # fmt: skip
# Bytes that break an encoding, quoting or framing.
HOSTILE_BYTES = (
    b"\x00", b"\xff", b"\xfe\xff", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\xf4\x90\x80\x80",
    b"\xef\xbb\xbf", b"\xe2\x80\xa8", b"\r", b"\r\n", b"\t", b"\x0b", b"\x1b", b'"', b"'",
    b"\\", b",", b";", b":", b"#", b"{", b"}", b"[", b"]", b"&", b"*", b"!", b"|", b">",
    b"%", b"@", b"`", b"\n", b" ", b"=",
)  # fmt: skip
NON_UTF8 = (b"\xff", b"\xfe", b"\xc3", b"\x80", b"\xed\xa0\x80", b"\xf8\x88\x80\x80\x80")
# Openers repeated past a parser's recursion: JSON, YAML flow and block, Prometheus labels.
NESTING = (b"[", b"{", b'{"a":', b"- ", b"{a: ", b"[{", b"a:\n ", b'{le="')
NESTING_DEPTHS = (64, 1_000, 20_000)
# Tokens swapped for a word or a quoted string.
HOSTILE_TOKENS = (
    b'""', b'"', b"null", b"true", b"false", b"[]", b"{}", b"~", b"&a", b"*a", b"!!binary",
    b"!!python/object:os.system", b"<<", b"?", b"'", b"+Inf", b"-Inf", b"NaN", b"le",
)  # fmt: skip
# Values put into a parsed tree.
HOSTILE_VALUES: tuple[Any, ...] = (
    float("nan"), float("inf"), float("-inf"), -1, -1.0, 0, 0.0, -0.0, 1e308, -1e308,
    5e-324, 2**53 + 1, 10**30, -(10**30), 10**400, True, False, None, "", " ", "x" * 1000,
    "NaN", "-1", "1e999", "\x00", "é", "\u2028", [], {}, [None], {"": None}, [[[]]],
)  # fmt: skip
# Label values for Prometheus series: new bucket bounds, escapes, nothing at all.
HOSTILE_LABELS = (
    "", "+Inf", "-Inf", "NaN", "inf", "1e308", "-1", "0", "le", '\\"', "\\\\", "\\n", "#",
    "app#dep#x", "a::b#c#d", " ",
)  # fmt: skip
# The longest mutant: a seed grows by duplication and nesting, never past this.
MAX_BYTES = 256 * 1024
# Nesting inside a tree stays shallow enough to serialise; bytes nest deeper.
_TREE_DEPTHS = (8, 40)

_NUMBER = re.compile(rb"[-+]?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?")
_TOKEN = re.compile(rb'"(?:[^"\\\n]|\\.)*"|\b\w+\b')
_LABEL = re.compile(rb'(\w+)="((?:[^"\\\n]|\\.)*)"')

ByteMutation = Callable[[bytes, random.Random, Sequence[bytes]], bytes]


class Mutator:
    """Mutants of a corpus: each `mutate(rng)` picks a seed and stacks mutations on it.

    `structure` says what the seeds are: "json" or "yaml" (also mutated as parsed trees),
    "prometheus" (also label edits), or None (bytes and lines only).
    """

    def __init__(
        self, seeds: Sequence[bytes], structure: str | None = None, max_bytes: int = MAX_BYTES
    ) -> None:
        if not seeds:
            raise ValueError("a mutator needs at least one seed")
        self.seeds = list(seeds)
        self.structure = structure
        self.max_bytes = max_bytes
        self._trees = [_load(seed, structure) for seed in self.seeds]
        self._mutations = BYTE_MUTATIONS + (
            PROMETHEUS_MUTATIONS if structure == "prometheus" else ()
        )

    def mutate(self, rng: random.Random) -> bytes:
        index = rng.randrange(len(self.seeds))
        data = self.seeds[index]
        tree = self._trees[index]
        if tree is not None and rng.random() < 0.6:
            value = copy.deepcopy(tree[0])
            for _ in range(rng.choice((1, 1, 2, 3, 5))):
                value = mutate_tree(value, rng)
            dumped = _dump(value, self.structure)
            if dumped is not None:
                data = dumped
                if rng.random() < 0.7:  # most tree mutants go in as they are
                    return data[: self.max_bytes]
        for _ in range(rng.choice((1, 1, 2, 3, 4, 8))):
            data = rng.choice(self._mutations)(data, rng, self.seeds)
            if len(data) > self.max_bytes:
                data = data[: self.max_bytes]
        return data


# ---------------------------------------------------------------- bytes


def _at(data: bytes, rng: random.Random) -> int:
    return rng.randint(0, len(data))


def _span(data: bytes, rng: random.Random, longest: int = 64) -> tuple[int, int]:
    if not data:
        return 0, 0
    start = rng.randrange(len(data))
    return start, min(len(data), start + rng.randint(1, longest))


def flip_bits(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    if not data:
        return data
    out = bytearray(data)
    for _ in range(rng.randint(1, 8)):
        out[rng.randrange(len(out))] ^= 1 << rng.randrange(8)
    return bytes(out)


def insert_byte(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    at = _at(data, rng)
    piece = rng.choice(HOSTILE_BYTES) if rng.random() < 0.7 else bytes([rng.randrange(256)])
    return data[:at] + piece * rng.choice((1, 1, 1, 2, 16)) + data[at:]


def delete_bytes(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    start, end = _span(data, rng)
    return data[:start] + data[end:]


def duplicate_chunk(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    start, end = _span(data, rng, longest=256)
    at = _at(data, rng)
    return data[:at] + data[start:end] * rng.choice((1, 2, 8, 64)) + data[at:]


def splice(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    other = rng.choice(corpus)
    return data[: _at(data, rng)] + other[_at(other, rng) :]


def replace_number(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    numbers = [m.span() for m in _NUMBER.finditer(data, 0, 1 << 16)]
    if not numbers:
        return insert_byte(data, rng, corpus)
    start, end = rng.choice(numbers)
    return data[:start] + rng.choice(HOSTILE_NUMBERS) + data[end:]


def replace_token(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    tokens = [m.span() for m in _TOKEN.finditer(data, 0, 1 << 16)]
    if not tokens:
        return insert_byte(data, rng, corpus)
    start, end = rng.choice(tokens)
    return data[:start] + rng.choice(HOSTILE_TOKENS) + data[end:]


def nest(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    at = _at(data, rng)
    return data[:at] + rng.choice(NESTING) * rng.choice(NESTING_DEPTHS) + data[at:]


def insert_non_utf8(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    at = _at(data, rng)
    return data[:at] + rng.choice(NON_UTF8) + data[at:]


def truncate(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    return data[: _at(data, rng)]


def edit_lines(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """Repeat, drop or swap lines: rows out of order, a header twice, a row lost."""
    lines = data.split(b"\n")
    row = rng.randrange(len(lines))
    what = rng.randrange(3)
    if what == 0:
        lines[row:row] = [lines[row]] * rng.choice((1, 2, 100))
    elif what == 1 and len(lines) > 1:
        del lines[row]
    else:
        other = rng.randrange(len(lines))
        lines[row], lines[other] = lines[other], lines[row]
    return b"\n".join(lines)


BYTE_MUTATIONS: tuple[ByteMutation, ...] = (
    flip_bits,
    insert_byte,
    delete_bytes,
    duplicate_chunk,
    splice,
    replace_number,
    replace_number,
    replace_token,
    nest,
    insert_non_utf8,
    truncate,
    edit_lines,
)


# ---------------------------------------------------------------- Prometheus text


def relabel(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """A label's value replaced: a new bucket bound, a new replica, an escape."""
    labels = [m.span(2) for m in _LABEL.finditer(data, 0, 1 << 16)]
    if not labels:
        return insert_byte(data, rng, corpus)
    start, end = rng.choice(labels)
    if rng.random() < 0.5:
        value = repr(rng.uniform(-10.0, 1e4)).encode()
    else:
        value = rng.choice(HOSTILE_LABELS).encode()
    return data[:start] + value + data[end:]


def new_series(data: bytes, rng: random.Random, corpus: Sequence[bytes]) -> bytes:
    """A sample line copied with one label changed: a series the endpoint never had."""
    lines = [line for line in data.split(b"\n") if _LABEL.search(line)]
    if not lines:
        return data
    copies = [relabel(rng.choice(lines), rng, corpus) for _ in range(rng.choice((1, 4, 32)))]
    return data.rstrip(b"\n") + b"\n" + b"\n".join(copies) + b"\n"


PROMETHEUS_MUTATIONS: tuple[ByteMutation, ...] = (relabel, relabel, new_series)


# ---------------------------------------------------------------- trees


# libyaml where PyYAML has it: the mutator parses and writes every structured input.
_LOADER: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER: type[yaml.SafeDumper] = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def _load(seed: bytes, structure: str | None) -> tuple[Any] | None:
    """The seed parsed as a one-tuple (its value may be None), or None if not structured."""
    try:
        if structure == "json":
            return (json.loads(seed),)
        if structure == "yaml":
            return (yaml.load(seed, Loader=_LOADER),)
    except (ValueError, yaml.YAMLError):
        return None
    return None


def _dump(value: Any, structure: str | None) -> bytes | None:
    try:
        if structure == "json":
            return json.dumps(value, allow_nan=True).encode()
        text = yaml.dump(value, Dumper=_DUMPER, allow_unicode=True, sort_keys=False, width=1 << 16)
        return text.encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError, yaml.YAMLError):
        return None


def _places(value: Any, limit: int = 4000) -> list[tuple[Any, Any]]:
    """(container, key or index) of every node under `value`, breadth first, at most `limit`."""
    places: list[tuple[Any, Any]] = []
    queue = [value]
    while queue and len(places) < limit:
        node = queue.pop(0)
        if isinstance(node, dict):
            items: list[tuple[Any, Any]] = list(node.items())
        elif isinstance(node, list):
            items = list(enumerate(node))
        else:
            continue
        for key, child in items:
            places.append((node, key))
            queue.append(child)
    return places


def _nested(depth: int, rng: random.Random) -> Any:
    value: Any = rng.choice((1, None, "x", float("nan")))
    for _ in range(depth):
        value = [value] if rng.random() < 0.5 else {"a": value}
    return value


def _new_value(old: Any, rng: random.Random, tree: Any) -> Any:
    roll = rng.random()
    if roll < 0.45:
        return copy.deepcopy(rng.choice(HOSTILE_VALUES))
    if roll < 0.6 and isinstance(old, int | float) and not isinstance(old, bool):
        factor = rng.choice((-1, 1e6, 1e-6, 1e300, 1e-300, 0))
        try:
            shifted = old * factor if rng.random() < 0.7 else old + rng.choice((-1, 1))
            return float(shifted) if rng.random() < 0.3 else shifted
        except OverflowError:  # an integer past float's range, times a float
            return -old
    if roll < 0.7:
        return _nested(rng.choice(_TREE_DEPTHS), rng)
    if roll < 0.8:
        return [copy.deepcopy(old)] if rng.random() < 0.5 else str(old)
    if roll < 0.9:  # another node's value: the right shape in the wrong place
        places = _places(tree, limit=400)
        if places:
            container, key = rng.choice(places)
            return copy.deepcopy(container[key])
    return rng.choice(("", "x", "NaN", "1", "true", "null", "-5", "1e400"))


def mutate_tree(value: Any, rng: random.Random) -> Any:
    """`value` (parsed JSON or YAML) with one node replaced, removed, repeated or renamed."""
    places = _places(value)
    if not places or rng.random() < 0.02:
        return _new_value(value, rng, value)
    container, key = rng.choice(places)
    what = rng.randrange(6)
    if what <= 1:
        container[key] = _new_value(container[key], rng, value)
    elif what == 2:
        del container[key]
    elif what == 3 and isinstance(container, list):
        repeat = rng.choice((1, 2, 50))
        container[key:key] = [copy.deepcopy(container[key]) for _ in range(repeat)]
    elif isinstance(container, dict):
        text = str(key)
        renamed = rng.choice(
            (text + "_", text[:-1], text.upper(), "zz_unknown", text + " ", f"{text}{text}")
        )
        if what == 4:
            container[renamed] = container.pop(key)  # a typo or an unknown key
        else:
            container[renamed] = copy.deepcopy(container[key])  # one more key
    else:
        container[key] = _new_value(container[key], rng, value)
    return value
