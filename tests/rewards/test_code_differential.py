"""Equal verdicts to a plain run: a corpus of programs built from what competition solutions do, each run plainly
(``python3 prog.py < input``, its output compared as the verifier compares) and through `CodeVerifier` in every
isolation mode (xrpo/rewards/code.py over xrpo/sandbox/); every verdict must be the same.

Most programs are correct (the verdict is 1.0 both ways); a few are wrong on purpose, so that agreeing is not the
same as passing everything. The one thing a correct program may not do in the sandbox, `asyncio`'s event loop (it
needs a socketpair, whose buffers no limit bounds: docs/code.md, "What a correct program may do"), is asserted to be
refused exactly so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import assert_nothing_left_running
from tests.sandbox.test_programs_honest import FAST_IO_TEMPLATE
from xrpo.rewards import CodeVerifier
from xrpo.rewards.code_compare import compare_stdout
from xrpo.sandbox import ISOLATION, probe

TIMEOUT = 10.0

NUMS = "5\n3 1 4 1 5\n"  # n, then n integers: most programs print their sum (14) or sorted order
SUM = [(NUMS, "14\n"), ("3\n10 -2 7\n", "15\n")]
BIG_N = 200_000
BIG = [(f"{BIG_N}\n" + " ".join(map(str, range(BIG_N))) + "\n", f"{BIG_N * (BIG_N - 1) // 2}\n")]

# name -> (program, [(stdin, expected stdout)], correct)
CORPUS: dict[str, tuple[str, list[tuple[str, str]], bool]] = {
    "input-split": ("n = int(input())\nprint(sum(map(int, input().split())))", SUM, True),
    "stdin-read-split": ("import sys\nd = sys.stdin.read().split()\nprint(sum(map(int, d[1:])))", SUM, True),
    "stdin-buffer-read": ("import sys\nd = sys.stdin.buffer.read().split()\nprint(sum(map(int, d[1:])))", SUM, True),
    "open-0": ("d = open(0).read().split()\nprint(sum(map(int, d[1:])))", SUM, True),
    "dev-stdin": ("d = open('/dev/stdin').read().split()\nprint(sum(map(int, d[1:])))", SUM, True),
    "readline-alias": (
        "import sys\ninput = sys.stdin.readline\nn = int(input())\nprint(sum(map(int, input().split())))",
        SUM,
        True,
    ),
    "fast-io-template": (
        FAST_IO_TEMPLATE + "n = int(input())\nprint(sum(map(int, input().split())))",
        SUM,
        True,
    ),
    "fast-io-template-big": (
        FAST_IO_TEMPLATE + "n = int(input())\nprint(sum(map(int, input().split())))",
        BIG,
        True,
    ),
    "stdout-write-join": (
        "import sys\nn = int(input())\na = sorted(map(int, input().split()))\n"
        "sys.stdout.write(' '.join(map(str, a)) + '\\n')",
        [(NUMS, "1 1 3 4 5\n")],
        True,
    ),
    "input-until-eof": (
        "total = 0\nwhile True:\n    try:\n        line = input()\n    except EOFError:\n        break\n"
        "    total += sum(map(int, line.split()))\nprint(total - int(total and 0))",
        [("1 2\n3\n4 5 6", "21\n")],
        True,
    ),
    "for-line-in-stdin": (
        "import sys\nprint(sum(int(x) for line in sys.stdin for x in line.split()))",
        [("1 2\n3\n", "6\n")],
        True,
    ),
    "sys-exit-0": ("import sys\nprint(14)\nsys.exit(0)\nprint('unreachable')", SUM[:1], True),
    "exit": ("print(14)\nexit()", SUM[:1], True),
    "quit": ("print(14)\nquit()", SUM[:1], True),
    "sys-exit-none-in-function": (
        "import sys\ndef main():\n    print(14)\n    sys.exit()\nmain()",
        SUM[:1],
        True,
    ),
    "atexit-prints": (
        "import atexit\nn = int(input())\ns = sum(map(int, input().split()))\natexit.register(print, s)",
        SUM,
        True,
    ),
    "atexit-flushes-a-buffer": (
        "import atexit, io, sys\nbuf = io.StringIO()\natexit.register(lambda: sys.stdout.write(buf.getvalue()))\n"
        "n = int(input())\nbuf.write(str(sum(map(int, input().split()))) + '\\n')",
        SUM,
        True,
    ),
    "os-write-fd1": (
        "import os\nn = int(input())\nos.write(1, (str(sum(map(int, input().split()))) + '\\n').encode())",
        SUM,
        True,
    ),
    "fd1-file-object-not-closed": (
        "out = open(1, 'w')\nn = int(input())\nout.write(str(sum(map(int, input().split()))) + '\\n')",
        SUM,
        True,
    ),
    "print-flush-false-at-exit": (
        "n = int(input())\nfor x in sorted(map(int, input().split())):\n    print(x, end=' ', flush=False)\nprint()",
        [(NUMS, "1 1 3 4 5\n")],
        True,
    ),
    "mixed-print-and-buffer": (
        "import sys\nprint(1)\nsys.stdout.flush()\nsys.stdout.buffer.write(b'2\\n')\nprint(3)",
        [("", "1\n2\n3\n")],
        True,
    ),
    "large-output": (
        "import sys\nn = int(input())\nsys.stdout.write('\\n'.join(map(str, range(n))) + '\\n')",
        [("300000\n", "".join(f"{i}\n" for i in range(300000)))],
        True,
    ),
    "large-output-prints": (
        "for i in range(int(input())):\n    print(i * i)",
        [("50000\n", "".join(f"{i * i}\n" for i in range(50000)))],
        True,
    ),
    "thread-deep-recursion": (
        "import sys, threading\nsys.setrecursionlimit(10**6)\nthreading.stack_size(2**26)\n"
        "def main():\n    n = int(input())\n    def f(k):\n        return 0 if k == 0 else k + f(k - 1)\n"
        "    print(f(n))\n"
        "threading.Thread(target=main).start()",
        [("100000\n", f"{100000 * 100001 // 2}\n")],
        True,
    ),
    "recursion-limit-dfs": (
        "import sys\nsys.setrecursionlimit(20000)\nn = int(input())\nadj = [[] for _ in range(n)]\n"
        "for i in range(1, n):\n    adj[i - 1].append(i)\nseen = [0] * n\n"
        "def dfs(u):\n    seen[u] = 1\n    for v in adj[u]:\n        dfs(v)\ndfs(0)\nprint(sum(seen))",
        [("5000\n", "5000\n")],
        True,
    ),
    "lru-cache-recursion": (
        "import sys\nfrom functools import lru_cache\nsys.setrecursionlimit(10000)\n"
        "@lru_cache(maxsize=None)\ndef fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n"
        "print(fib(int(input())))",
        [("90\n", "2880067194370816120\n")],
        True,
    ),
    "thread-pool": (
        "from concurrent.futures import ThreadPoolExecutor\nn = int(input())\na = list(map(int, input().split()))\n"
        "with ThreadPoolExecutor(4) as ex:\n    print(sum(ex.map(lambda x: x, a)))",
        SUM,
        True,
    ),
    "math": (
        "import math\nprint(math.gcd(12, 18), math.comb(10, 3), math.isqrt(10**18), f'{math.pi:.6f}')",
        [("", "6 120 1000000000 3.141593\n")],
        True,
    ),
    "fractions": (
        "from fractions import Fraction\nprint(sum(Fraction(1, k) for k in range(1, 6)))",
        [("", "137/60\n")],
        True,
    ),
    "decimal": (
        "from decimal import Decimal, getcontext\ngetcontext().prec = 30\nprint(Decimal(1) / Decimal(7))",
        [("", "0.142857142857142857142857142857\n")],
        True,
    ),
    "float-answer": ("print(2 ** 0.5)", [("", "1.41421356\n")], True),
    "numpy": (
        "import numpy as np\nn = int(input())\na = np.array(input().split(), dtype=np.int64)\nprint(int(a.sum()))",
        SUM,
        True,
    ),
    "numpy-linalg": (
        "import numpy as np\nm = np.array([[2.0, 1.0], [1.0, 3.0]])\nprint(round(float(np.linalg.det(m)), 6))",
        [("", "5.0\n")],
        True,
    ),
    "heapq-bisect-collections": (
        "import heapq, bisect\nfrom collections import Counter, deque, defaultdict\nn = int(input())\n"
        "a = list(map(int, input().split()))\nh = a[:]\nheapq.heapify(h)\nc = Counter(a)\nd = deque(sorted(a))\n"
        "print(heapq.heappop(h), c.most_common(1)[0][0], bisect.bisect_left(sorted(a), 4), d.pop())",
        [(NUMS, "1 1 3 5\n")],
        True,
    ),
    "itertools-permutations": (
        "from itertools import permutations\nprint(sum(1 for p in permutations(range(7)) if p[0] < p[-1]))",
        [("", "2520\n")],
        True,
    ),
    "stringio-accumulate": (
        "from io import StringIO\nout = StringIO()\nfor i in range(int(input())):\n    out.write(f'{i}\\n')\n"
        "print(out.getvalue(), end='')",
        [("3\n", "0\n1\n2\n")],
        True,
    ),
    "temp-file-in-cwd": (
        "n = int(input())\nwith open('scratch.txt', 'w') as f:\n    f.write(input())\n"
        "with open('scratch.txt') as f:\n    print(sum(map(int, f.read().split())))",
        SUM,
        True,
    ),
    "tempfile-module": (
        "import tempfile\nwith tempfile.TemporaryFile('w+') as f:\n    f.write('14')\n    f.seek(0)\n"
        "    print(f.read())",
        SUM[:1],
        True,
    ),
    "os-listdir-cwd": (
        "import os\nopen('made.txt', 'w').close()\nprint('made.txt' in os.listdir('.'))",
        [("", "True\n")],
        True,
    ),
    "regex-and-strings": (
        "import re\ns = input()\nprint(len(re.findall(r'[aeiou]', s)), s[::-1].upper())",
        [("hello world\n", "3 DLROW OLLEH\n")],
        True,
    ),
    "dataclass-enum-typing": (
        "from dataclasses import dataclass\nfrom enum import Enum\nfrom typing import List\n"
        "class C(Enum):\n    A = 1\n@dataclass(order=True)\nclass P:\n    x: int\n    y: int\n"
        "ps: List[P] = sorted([P(2, 1), P(1, 5)])\nprint(ps[0].x, C.A.value)",
        [("", "1 1\n")],
        True,
    ),
    "random-seeded": (
        "import random\nrandom.seed(7)\na = [random.randint(1, 100) for _ in range(5)]\nprint(len(a), min(a) >= 1)",
        [("", "5 True\n")],
        True,
    ),
    "struct-array": (
        "import array, struct\na = array.array('i', range(5))\n"
        "print(sum(a), struct.unpack('<I', struct.pack('<I', 258))[0])",
        [("", "10 258\n")],
        True,
    ),
    "stderr-debug-output": (
        "import sys\nn = int(input())\nprint('debug', n, file=sys.stderr)\nprint(sum(map(int, input().split())))",
        SUM,
        True,
    ),
    "time-perf-counter": (
        "import time\nt = time.perf_counter()\nprint(14 if time.perf_counter() >= t else 0)",
        SUM[:1],
        True,
    ),
    "crlf-input": (
        "s = input()\nprint(len(s.strip()), s.strip())",
        [("abc\r\n", "3 abc\n")],
        True,
    ),
    # wrong on purpose: the verdict is 0.0 both ways
    "wrong-answer": ("n = int(input())\nprint(sum(map(int, input().split())) + 1)", SUM, False),
    "exits-nonzero": ("print(14)\nimport sys\nsys.exit(3)", SUM[:1], False),
    "raises": ("n = int(input())\nprint(14)\nraise ValueError('late')", SUM[:1], False),
    "daemon-thread-never-prints": (
        "import threading, time\ndef late():\n    time.sleep(5)\n    print(14)\n"
        "threading.Thread(target=late, daemon=True).start()",
        SUM[:1],
        False,
    ),
}
# Refused in the sandbox on purpose, with the refusal each gets (docs/code.md, "What a correct program may do").
REFUSED = {
    "asyncio": (
        "import asyncio\nasync def main():\n    await asyncio.sleep(0)\n    return 14\nprint(asyncio.run(main()))",
        SUM[:1],
        "self_pipe",  # its self-pipe is a socketpair (refused with EPERM; the detail is the traceback's tail)
    ),
}


def plain_verdict(program: str, tests: list[tuple[str, str]], tmp_path) -> float:
    """``python3 prog.py < input`` in a fresh directory, each test's stdout compared as the verifier compares."""
    for k, (stdin, want) in enumerate(tests):
        d = tmp_path / f"plain-{k}"
        d.mkdir(parents=True)
        (d / "prog.py").write_text(program)
        (d / "in.txt").write_text(stdin, newline="")
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
        with open(d / "in.txt", "rb") as f:
            try:
                proc = subprocess.run(
                    [sys.executable, "prog.py"], stdin=f, capture_output=True, cwd=d, env=env, timeout=TIMEOUT
                )
            except subprocess.TimeoutExpired:
                return 0.0
        if proc.returncode != 0 or not compare_stdout(proc.stdout, want)[0]:
            return 0.0
    return 1.0


def reference(tests: list[tuple[str, str]]) -> str:
    return json.dumps([{"input": i, "output": o} for i, o in tests])


def modes() -> list[str]:
    out = []
    for mode in ISOLATION:
        try:
            probe(mode)
        except RuntimeError:  # "strict" where this machine cannot give every layer
            continue
        out.append(mode)
    return out


@pytest.fixture(autouse=True)
def nothing_left_running():
    yield
    assert_nothing_left_running()


def test_the_corpus_is_large_and_covers_what_competition_programs_do():
    assert len(CORPUS) >= 40
    assert sum(correct for _, _, correct in CORPUS.values()) >= 40


def test_every_verdict_equals_a_plain_runs_in_every_isolation_mode(tmp_path):
    if importlib_missing("numpy"):
        pytest.skip("numpy is not installed: two programs of the corpus import it")
    names = list(CORPUS)
    plain = {name: plain_verdict(textwrap.dedent(CORPUS[name][0]), CORPUS[name][1], tmp_path / name) for name in names}
    # the corpus is what it says: the correct programs pass a plain run, the wrong ones fail it
    assert {n: v for n, v in plain.items() if v != float(CORPUS[n][2])} == {}
    completions = [f"```python\n{CORPUS[n][0]}\n```" for n in names]
    references = [reference(CORPUS[n][1]) for n in names]
    for mode in modes():
        v = CodeVerifier(timeout=TIMEOUT, sample_timeout=30.0, memory_mb=1024, workers=2, isolation=mode)
        results = v.verify_batch(completions, references)
        differ = {
            n: (plain[n], r.score, r.reason, r.metadata.get("detail", "")[-300:])
            for n, r in zip(names, results)
            if r.score != plain[n]
        }
        assert differ == {}, mode


def test_what_the_sandbox_refuses_is_refused_exactly_so(tmp_path):
    for name, (program, tests, why) in REFUSED.items():
        assert plain_verdict(program, tests, tmp_path / name) == 1.0, name
        for mode in modes():
            v = CodeVerifier(timeout=TIMEOUT, sample_timeout=30.0, memory_mb=1024, workers=1, isolation=mode)
            r = v.verify_batch([f"```python\n{program}\n```"], [reference(tests)])[0]
            assert r.score == 0.0 and r.reason == "runtime_error" and why in r.metadata["detail"], (name, mode, r)


def importlib_missing(name: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(name) is None
