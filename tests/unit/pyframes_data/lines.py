"""Prints, for every code object of this file (and of the stdlib's `json.decoder`, a
module with loops, comprehensions and exception handlers), the interpreter's own answer to
"which line is code unit i on": test_pyframes.cpp checks gpuheap's decoder of co_linetable
against it. One line per code object: firstlineno, linetable hex, then line per code unit
(0 where the interpreter has none)."""
import sys
import types

import json.decoder


def sample(xs):
    total = 0
    for x in xs:
        if x % 3 == 0:
            total += x
        else:
            try:
                total -= int(str(x))
            except ValueError:
                pass
    return [y * 2 for y in range(total)
            if y
            > 1]


def codes(co):
    yield co
    for c in co.co_consts:
        if isinstance(c, types.CodeType):
            yield from codes(c)


def main():
    roots = [sample.__code__, codes.__code__, compile(open(json.decoder.__file__).read(), json.decoder.__file__, "exec")]
    print(f"python {sys.version_info.major}.{sys.version_info.minor}")
    for root in roots:
        for co in codes(root):
            units = len(co.co_code) // 2
            line = [0] * units
            for start, end, ln in co.co_lines():  # byte offsets
                for u in range(start // 2, end // 2):
                    line[u] = ln if ln is not None else 0
            print(co.co_firstlineno, co.co_linetable.hex() or "-", *line)


main()
