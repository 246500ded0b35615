"""The `code` verifier: run the completion's last Python code block against the problem's tests in a sandbox.

Grading one completion against a reference:

1. extract the program (`extract_code`): the last fenced block tagged python / py / python3; if none is tagged,
   the last untagged block. A fence left open (a truncated completion) does not count. None -> score 0, reason
   "no_code" (`metadata["detail"]` says why).
2. parse the reference (`xrpo.rewards.code_formats.parse_tests`: LiveCodeBench, DeepCoder, APPS / TACO and HumanEval
   formats, and the ``fields`` column mapping) into stdin tests, function-call tests, or one HumanEval `check`. A
   reference that is not in one of these formats raises ValueError naming the batch index: a malformed dataset is
   an error, never a silent zero reward.
3. run the program once per test in the sandbox (`xrpo.sandbox.run_program`, whose module docstring lists what it
   guarantees and what it does not), under a per-test and a per-program wall-clock limit.
4. compare outside the sandbox (the program never sees an expected output), by the rules of
   `xrpo.rewards.code_compare`: stdin tests token by token (``compare="tokens"``, default; integers exactly, real
   numbers within ``float_tol``) or line by line (``compare="lines"``, LiveCodeBench's rule), function-call tests by
   the returned value. Check mode (HumanEval): `check(candidate)` returned without raising. An exception the
   candidate raises reaches the check as the same builtin class, except StopIteration / StopAsyncIteration, which
   would end a ``map()`` or ``iter(f, sentinel)`` loop of the check as if all had passed: they become RuntimeError
   (as PEP 479 does).
   A test passes when its process exited 0 and its output matches. Score 1.0 when every test passes, else 0.0.
   The grader's own work is linear in what the program printed (no backtracking regular expression over it) and
   it keeps one test's output at a time (each is compared as it arrives, `run_program`'s ``on_test``).

`VerifyResult.reason` for a score of 0: "no_code", "syntax_error", "wrong_answer", "runtime_error", "timeout",
"memory", "output_limit", "sample_timeout" (the per-program limit passed before every test ran), "sandbox_error".
`metadata`: ``passed``, ``total``, ``fraction`` (passed / total), ``tests`` (one character per test: "." pass,
"W" wrong answer, "E" runtime error, "T" timeout, "M" memory, "O" output limit, "-" not run), ``failed_test`` (index
of the first failure), ``detail`` (its stderr tail, the compile error, or what differed), ``isolation`` (the sandbox
layers in force) and ``time_s``. `VerifyResult.answer` is ``"code:<sha1 prefix>"`` of the extracted program, so that
cons@k votes on identical programs; None without a program.

Parallelism: `verify_batch` grades each distinct (program, reference) pair once, running up to ``workers`` sandboxes
at a time (default: the usable CPU cores). Each sandbox is a process tree that the caller's thread waits on, so no
Python work of the program ever runs in the caller. A batch takes at most about
``ceil(n / workers) * (sample_timeout + 10 s)``.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from xrpo.rewards.code_compare import compare_returned, compare_stdout
from xrpo.rewards.code_formats import TestSpec, check_undefined_names, field_names, parse_tests
from xrpo.rewards.registry import Verifier, VerifyResult, check_batch, register_verifier
from xrpo.sandbox import ISOLATION, PACKAGES, Limits, SandboxResult, TestOutcome, default_workers, run_program

__all__ = ["CodeVerifier", "extract_code"]

# Linear on any completion: the fence's info string is taken whole (`[^\n]*` next to a tag class that overlaps it
# backtracked quadratically over a long unterminated line), and the tag is read from it afterwards.
_FENCE = re.compile(r"^[ \t]*```([^\n]*)\n", re.M)
_TAG = re.compile(r"[A-Za-z0-9_+#.-]*")
_CLOSE = re.compile(r"^[ \t]*```[ \t]*$", re.M)
_PYTHON_TAGS = {"python", "py", "python3", "py3"}
_STATUS_CHAR = {"ok": ".", "runtime_error": "E", "timeout": "T", "memory": "M", "output_limit": "O", "not_run": "-"}


# ---------------------------------------------------------------------------------------------------------------
# Code extraction
# ---------------------------------------------------------------------------------------------------------------


def extract_code(completion: str) -> tuple[str | None, str]:
    """The program in `completion`: the last closed fenced block tagged python, else the last closed untagged one.

    Returns `(code, detail)`: detail is "python" / "untagged" for a found block, or why there is none: "no_fence",
    "unclosed" (the only candidate block is never closed), "language:<tag>" (only blocks of other languages),
    "empty".
    """
    # the last block of each kind, as spans (a completion of many small blocks costs no list of them)
    tagged = untagged = None
    last_tag = None
    pos = 0
    unclosed = False
    while True:
        m = _FENCE.search(completion, pos)
        if m is None:
            break
        end = _CLOSE.search(completion, m.end())
        if end is None:
            unclosed = True
            break
        last_tag = _TAG.match(m.group(1).lstrip(" \t")).group(0).lower()
        if last_tag in _PYTHON_TAGS:
            tagged = (m.end(), end.start())
        elif not last_tag:
            untagged = (m.end(), end.start())
        pos = end.end()
    if tagged:
        code, detail = completion[tagged[0] : tagged[1]], "python"
    elif untagged:
        code, detail = completion[untagged[0] : untagged[1]], "untagged"
    elif last_tag is not None:
        return None, f"language:{last_tag}"
    else:
        return None, "unclosed" if unclosed else "no_fence"
    if not code.strip():
        return None, "empty"
    return code, detail


def _defines(code: str, name: str) -> bool:
    """Does `code` have a line ``def name(``? (Horizontal whitespace only: ``^\\s*`` crosses newlines, and its
    backtracking over a long run of blank lines was quadratic.)"""
    return re.search(rf"^[ \t]*def[ \t]+{re.escape(name)}[ \t]*\(", code, re.M) is not None


def _with_prompt(code: str, spec: TestSpec) -> str:
    """The program HumanEval's own harness runs, prompt + completion: a completion that continues the prompt (a
    function body) is appended to it; one that restates the function (what chat models write) gets the prompt's
    code before it all the same, so that the imports and helpers the prompt defines exist (HumanEval/10, /32, /38),
    the restated function replacing the prompt's. A prompt that ends in a bare header comes with a ``pass`` body
    there (`TestSpec.prelude`), so that the restatement can follow it."""
    if _defines(code, spec.entry_point):
        return (spec.prelude or "") + "\n" + code
    return spec.prompt + code


# ---------------------------------------------------------------------------------------------------------------
# The verifier
# ---------------------------------------------------------------------------------------------------------------


def _reference_error(e: ValueError | SyntaxError) -> str:
    """What is wrong with a reference, for messages: a ValueError says it; a SyntaxError is named as one."""
    return f"SyntaxError: {e}" if isinstance(e, SyntaxError) else str(e)


@register_verifier("code")
class CodeVerifier(Verifier):
    """Verifier for programs (see the module docstring).

    Args:
        timeout: wall-clock seconds per test.
        sample_timeout: wall-clock seconds for all the tests of one completion.
        memory_mb: address space per process.
        workers: sandboxes run at once; default: the usable CPU cores.
        compare: "tokens" (default) or "lines" (LiveCodeBench's exact rule) for stdin tests.
        float_tol: absolute-or-relative tolerance for real numbers.
        fields: column mapping for the reference (`xrpo.rewards.code_formats`).
        isolation: "auto", "strict" or "minimal" (`xrpo.sandbox.run_program`).
        stop_on_failure: stop a completion's tests at the first failure (faster; `fraction` is then a lower bound).
        max_output_mb: stdout read per test.
        max_processes: processes and threads per program.
        packages: third-party packages programs may import (`xrpo.sandbox.run_program`; default numpy, where
            installed).
    """

    name = "code"

    def __init__(
        self,
        *,
        timeout: float = 4.0,
        sample_timeout: float = 30.0,
        memory_mb: int = 1024,
        workers: int | None = None,
        compare: str = "tokens",
        float_tol: float = 1e-6,
        fields: Mapping[str, str] | None = None,
        isolation: str = "auto",
        stop_on_failure: bool = False,
        max_output_mb: int = 16,
        max_processes: int = 16,
        packages: Sequence[str] = PACKAGES,
    ):
        if workers is not None and (not isinstance(workers, int) or isinstance(workers, bool) or workers < 1):
            raise ValueError(f"workers: expected None or an integer >= 1, got {workers!r}")
        if compare not in ("tokens", "lines"):
            raise ValueError(f"compare: expected 'tokens' or 'lines', got {compare!r}")
        if isinstance(float_tol, bool) or not isinstance(float_tol, (int, float)) or not 0 <= float_tol < 1:
            raise ValueError(f"float_tol: expected a number in [0, 1), got {float_tol!r}")
        if isolation not in ISOLATION:
            raise ValueError(f"isolation: expected one of {ISOLATION}, got {isolation!r}")
        if not isinstance(max_output_mb, int) or isinstance(max_output_mb, bool) or max_output_mb < 1:
            raise ValueError(f"max_output_mb: expected an integer >= 1, got {max_output_mb!r}")
        if isinstance(packages, str) or not all(isinstance(p, str) and p.isidentifier() for p in packages):
            raise ValueError(f"packages: expected a list of top-level package names, got {packages!r}")
        self.packages = tuple(packages)
        self.limits = Limits(
            timeout=timeout,
            sample_timeout=sample_timeout,
            memory_mb=memory_mb,
            max_output_bytes=max_output_mb * 2**20,
            max_processes=max_processes,
        )
        field_names(fields)  # validate now, not at the first batch
        self.fields = dict(fields or {})
        self.workers = workers or default_workers()
        self.compare = compare
        self.float_tol = float(float_tol)
        self.isolation = isolation
        self.stop_on_failure = bool(stop_on_failure)
        self._specs: dict[str, TestSpec] = {}

    def __repr__(self) -> str:
        return (
            f"CodeVerifier(workers={self.workers}, timeout={self.limits.timeout:g}, "
            f"sample_timeout={self.limits.sample_timeout:g}, isolation={self.isolation!r})"
        )

    def _spec(self, reference: str, index: int) -> TestSpec:
        spec = self._specs.get(reference)
        if spec is None:
            try:
                spec = parse_tests(reference, self.fields)
            except (ValueError, SyntaxError) as e:  # a HumanEval prompt that is not Python: SyntaxError
                raise ValueError(
                    f"references[{index}]: {_reference_error(e)} (reference starts {reference[:80]!r})"
                ) from None
            if len(self._specs) > 4096:
                self._specs.clear()
            self._specs[reference] = spec
        return spec

    def reference_errors(self, references: Sequence[str]) -> list[tuple[int, str]]:
        """Every reference that is not a test list this verifier reads, or whose HumanEval check does not
        compile."""
        errors = []
        for i, ref in enumerate(references):
            try:
                if not isinstance(ref, str):
                    raise ValueError(f"expected a string, got {type(ref).__name__}")
                spec = parse_tests(ref, self.fields)
                if spec.mode == "check":
                    missing = check_undefined_names(spec.check_code, spec.prelude)
                    if missing:
                        raise ValueError(
                            f"the check calls {', '.join(missing)}, which neither its code nor the reference's "
                            f"'prompt' defines (the check runs apart from the program, so it cannot take them "
                            f"from the completion: add the problem's prompt to the reference)"
                        )
            except (ValueError, SyntaxError) as e:
                errors.append((i, _reference_error(e)))
        return errors

    def verify_batch(self, completions: Sequence[str], references: Sequence[str]) -> list[VerifyResult]:
        completions, references = check_batch(completions, references)
        specs = [self._spec(ref, i) for i, ref in enumerate(references)]
        results: list[VerifyResult | None] = [None] * len(completions)
        jobs: dict[tuple[str, str], list[int]] = {}
        programs: list[str | None] = []
        for i, (completion, ref) in enumerate(zip(completions, references)):
            code, detail = extract_code(completion)
            spec = specs[i]
            if code is not None and spec.mode == "check" and spec.prompt:
                code = _with_prompt(code, spec)
            programs.append(code)
            if code is None:
                results[i] = VerifyResult(
                    0.0, None, "no_code", {"detail": detail, "passed": 0, "total": len(spec.inputs), "fraction": 0.0}
                )
                continue
            jobs.setdefault((code, ref), []).append(i)
        if jobs:
            keys = list(jobs)
            with ThreadPoolExecutor(max_workers=min(self.workers, len(keys)), thread_name_prefix="xrpo-code") as ex:
                verdicts = list(ex.map(lambda k: self._grade(k[0], specs[jobs[k][0]]), keys))
            for key, verdict in zip(keys, verdicts):
                for i in jobs[key]:
                    results[i] = verdict
        return results  # type: ignore[return-value]

    def _grade(self, code: str, spec: TestSpec) -> VerifyResult:
        answer = "code:" + hashlib.sha1(code.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        verdicts: dict[int, tuple[bool, str]] = {}

        def judge(i: int, test: TestOutcome) -> TestOutcome:
            # Each test's output is compared as it arrives and then dropped: the grader holds one test's output at
            # a time, not every test's (up to the output cap each), and keeps only what a verdict needs.
            ok, why = self._check(test, spec.expected[i], spec.mode) if i < len(spec.expected) else (False, "")
            verdicts[i] = ok, why
            return TestOutcome(test.status, test.exit_code, test.signal, stderr="" if ok else test.stderr[-500:])

        res: SandboxResult = run_program(
            code,
            spec.mode,
            spec.inputs,
            fn_name=spec.fn_name,
            check_code=spec.check_code,
            entry_point=spec.entry_point,
            check_prelude=spec.prelude,
            limits=self.limits,
            isolation=self.isolation,
            stop_on_failure=self.stop_on_failure,
            on_test=judge,
            packages=self.packages,
        )
        total = len(spec.inputs)
        meta: dict[str, Any] = {"total": total, "isolation": list(res.isolation), "time_s": round(res.wall_s, 4)}
        if res.status == "compile_error":
            meta.update(passed=0, fraction=0.0, tests="-" * total, detail=res.error)
            return VerifyResult(0.0, answer, "syntax_error", meta)
        chars, passed, first = [], 0, None
        for i, test in enumerate(res.tests):
            ok, why = verdicts.get(i, (False, ""))
            if ok:
                passed += 1
                chars.append(".")
                continue
            chars.append("W" if test.status == "ok" else _STATUS_CHAR.get(test.status, "E"))
            if first is None:
                first = (i, test, why)
        meta.update(passed=passed, fraction=passed / total if total else 0.0, tests="".join(chars))
        if res.status in ("sandbox_error", "timeout") and passed < total:
            meta.update(detail=res.error[-500:])
            return VerifyResult(0.0, answer, "sandbox_error" if res.status == "sandbox_error" else "timeout", meta)
        if first is None:
            return VerifyResult(1.0, answer, None, meta)
        i, test, why = first
        reason = {"ok": "wrong_answer", "not_run": "sample_timeout"}.get(test.status, test.status)
        if test.status == "not_run" and self.stop_on_failure:
            reason = "not_run"
        meta.update(
            failed_test=i,
            detail=(
                why
                or test.stderr[-500:]
                or (f"killed by signal {test.signal}" if test.signal else f"exit code {test.exit_code}")
            ),
        )
        return VerifyResult(0.0, answer, reason, meta)

    def _check(self, test: TestOutcome, want: Any, mode: str) -> tuple[bool, str]:
        if test.status != "ok":
            return False, ""
        try:
            if mode == "stdin":
                return compare_stdout(test.stdout, want, mode=self.compare, float_tol=self.float_tol)
            if mode == "check":
                return test.value == b"pass", ""
            return compare_returned(test.value or b"", want, float_tol=self.float_tol)
        except Exception as e:  # noqa: BLE001 - the comparisons never raise; if one ever does, the test fails
            return False, f"the output could not be compared ({type(e).__name__})"
