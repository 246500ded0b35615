"""The program's own process inside the sandbox (part of the boot, `xrpo.sandbox._boot`): the interpreter as
``python3 solution.py < input`` would give it to the program, and the program's end as that interpreter ends it.

- `prepare_interpreter` (once per run, in the harness, so that every test inherits it): the builtins `site` adds
  (``exit``, ``quit``, ``help``, ``copyright``, ``credits``, ``license``: the sandbox runs ``python -I -S``, without
  `site`), and the third-party packages the caller allows (`Limits` has none; `run_program`'s ``packages``) importable
  by name, each from its own directory and nothing else of its site-packages.
- `run_program_process` (once per test, in the test's forked process): the interpreter's own standard streams
  (``sys.stdin`` is CPython's ``TextIOWrapper`` over fd 0 with its ``mode``, ``name``, ``buffer``, ``fileno()``, ...),
  ``sys.argv``, ``sys.path[0]`` the program's directory, then the program, then `finalize`: what
  ``Py_FinalizeEx`` does, in its order (non-daemon threads joined, ``atexit`` handlers, the standard streams flushed,
  the garbage collected, the standard streams restored and the program's globals cleared so that file objects it
  left open are closed and flushed, the standard streams flushed again).

Runs inside the sandbox's interpreter in one namespace with the boot's other parts (`xrpo.sandbox.programs.BOOT_PARTS`):
standard library only, nothing from xrpo.
"""

import os
import sys

if __name__ != "_boot":  # imported (tests, tools); the sandbox runs every part in one namespace instead
    from xrpo.sandbox._boot_check import print_exception, run_check


def write_all(fd: int, data) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


class PackageFinder:
    """Finds the allowed third-party packages (top-level names only) in their own directories: the program imports
    ``numpy`` as after ``pip install numpy``, and no other package of the same site-packages."""

    packages: dict = {}  # top-level name -> the directory holding it

    @classmethod
    def find_spec(cls, name, path=None, target=None):
        where = cls.packages.get(name) if path is None else None
        if where is None:
            return None
        from importlib.machinery import PathFinder

        return PathFinder.find_spec(name, [where])

    @classmethod
    def invalidate_caches(cls) -> None:
        pass


def prepare_interpreter(job: dict) -> None:
    """What `site` would have set up, and the allowed packages (module docstring)."""
    import site

    site.setquit()
    site.setcopyright()
    site.sethelper()
    PackageFinder.packages = dict(job.get("packages") or {})
    if PackageFinder.packages:
        sys.meta_path.append(PackageFinder)
    import atexit  # noqa: F401 - once here, for `finalize` in every test
    import gc

    # everything the harness holds now outlives every test: out of the collector's sight, the collections of
    # `finalize` scan only what the program made (a few objects, not the harness's tens of thousands)
    gc.collect()
    gc.freeze()


def exit_code(e: SystemExit) -> int:
    """The exit status the interpreter gives an uncaught SystemExit (printing a message that is not an int)."""
    if e.code is None:
        return 0
    if isinstance(e.code, int):
        return e.code & 0xFF
    try:
        sys.stderr.write(f"{e.code}\n")
    except Exception:
        pass
    return 1


def finalize(g: dict | None, code: int) -> int:
    """End the program as the interpreter does at exit (``Py_FinalizeEx``), in its order; returns the exit status
    (120 when flushing stdout fails, as CPython). Never raises."""
    threading = sys.modules.get("threading")
    if threading is not None:
        try:  # non-daemon threads are joined: `threading.Thread(target=main).start()` prints after the main body
            threading._shutdown()
        except BaseException:  # noqa: BLE001 - printed, as the interpreter does
            print_exception()
    try:
        import atexit

        atexit._run_exitfuncs()  # prints and ignores what a handler raises
    except BaseException:  # noqa: BLE001
        pass
    code = _flush_standard_streams(code)
    try:
        import gc

        gc.collect()
        # module teardown (finalize_modules): the standard streams back to the interpreter's own, then the program's
        # globals cleared, names starting with one underscore first (as _PyModule_ClearDict), so that the objects
        # only they hold are finalized: a file object left open on fd 1 is flushed and closed; a replaced sys.stdout
        # (a fast-I/O wrapper) too. What a finalizer raises is printed and ignored, as the interpreter does.
        sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
        if g is not None:
            for key in [k for k in g if k.startswith("_") and not k.startswith("__")] + list(g):
                if key != "__builtins__" and key in g:  # builtins stay for the finalizers, as in CPython
                    g[key] = None
        gc.collect()
    except BaseException:  # noqa: BLE001
        pass
    return _flush_standard_streams(code)  # what the finalizers printed


def _flush_standard_streams(code: int) -> int:
    for name in ("stdout", "stderr"):
        f = getattr(sys, name, None)
        try:
            if f is not None and not getattr(f, "closed", False):
                f.flush()
        except BaseException:  # noqa: BLE001
            if name == "stdout":
                code = code or 120
    return code


def _jsonable(x, depth=0):
    """The returned value as JSON data: tuples become lists (LiveCodeBench does the same), sets sorted lists."""
    if depth > 100:
        raise ValueError("returned value nested too deeply")
    if isinstance(x, (list, tuple)):
        return [_jsonable(v, depth + 1) for v in x]
    if isinstance(x, (set, frozenset)):
        items = [_jsonable(v, depth + 1) for v in x]
        try:
            return sorted(items)
        except TypeError:
            return items
    if isinstance(x, dict):
        return {(k if isinstance(k, str) else repr(k)): _jsonable(v, depth + 1) for k, v in x.items()}
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    return {"__unserializable__": type(x).__name__}


def run_program_process(mode, code_obj, job, args) -> None:
    """Runs inside the test process (fds 0-2 the test's stdin file and pipes, fd 3 the value pipe); never returns."""
    import builtins

    # the interpreter's own standard streams, made by CPython at start-up over fds 0, 1 and 2 (which now are the
    # test's): every attribute a fast-I/O template reads (mode, name, buffer, fileno(), encoding, newlines) is there
    sys.stdin, sys.stdout, sys.stderr = sys.__stdin__, sys.__stdout__, sys.__stderr__
    sys.argv = ["solution.py"]
    sys.path.insert(0, os.getcwd())  # the program's directory, as `python3 solution.py` puts it first
    code = 0
    g = None
    try:
        if mode == "check":
            run_check(code_obj, job)
            sys.stdout.flush()
            write_all(3, b"pass")
            os._exit(0)
        g = {
            "__name__": "__main__" if mode == "stdin" else "solution",
            "__builtins__": builtins,
            "__file__": "solution.py",
        }
        exec(code_obj, g)
        if mode == "call":
            name = job["fn_name"]
            sol = g.get("Solution")
            if isinstance(sol, type) and hasattr(sol, name):
                fn = getattr(sol(), name)  # LeetCode style (LiveCodeBench "functional")
            elif callable(g.get(name)):
                fn = g[name]
            else:
                raise NameError(f"the program defines no function {name!r} (nor a class Solution with that method)")
            value = fn(*args)
            import json

            payload = json.dumps(_jsonable(value), allow_nan=True).encode()
            sys.stdout.flush()
            write_all(3, payload)
    except SystemExit as e:
        code = exit_code(e)
    except BaseException:
        print_exception()
        code = 1
    os._exit(finalize(g, code))
