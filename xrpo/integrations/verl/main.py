"""Launch XRPO on verl: ``python -m xrpo.integrations.verl.main [key=value ...]`` or ``xrpo verl --config FILE``.

The config is verl's hydra config: ``xrpo_trainer.yaml`` (verl's ``ppo_trainer`` + ``xrpo_base.yaml``, the XRPO
settings) composed with hydra overrides, or your own YAML whose defaults list ``ppo_trainer`` then ``xrpo_base``
(see examples/verl/). Hydra's own
flags work with the module form (``--config-path DIR --config-name NAME``, ``--cfg job`` to print the config).

What happens: the config is checked (verl's ``validate_config`` and `validate_xrpo_config`) before anything starts,
then verl's ``run_ppo`` starts or joins the Ray cluster (``ray_kwargs.ray_init``; on a multi-node cluster start Ray
first and run this on the head node) and runs `XRPOTaskRunner` as a Ray actor: it builds verl's worker groups
(FSDP / Megatron actor with vLLM / SGLang rollout), datasets and `RayXRPOTrainer`, and trains.
"""

from __future__ import annotations

import os
import re
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

import hydra
import ray
from omegaconf import DictConfig, OmegaConf

__all__ = [
    "XRPOTaskRunner",
    "check_config",
    "check_data_files",
    "config_error",
    "load_config",
    "main",
    "nearest_key",
    "run",
]

CONFIG_MODULE = "xrpo.integrations.verl.config"
CONFIG_NAME = "xrpo_trainer"


def load_config(config_file: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> DictConfig:
    """Compose the run's config with hydra: ``xrpo_trainer.yaml``, or ``config_file`` (a YAML whose defaults list
    ``ppo_trainer`` and ``xrpo_base``, with ``pkg://xrpo.integrations.verl.config`` and ``pkg://verl.trainer.config``
    on its hydra searchpath), plus ``overrides``."""
    from hydra import compose, initialize_config_dir, initialize_config_module

    overrides = list(overrides)
    if config_file is None:
        with initialize_config_module(config_module=CONFIG_MODULE, version_base=None):
            return compose(config_name=CONFIG_NAME, overrides=overrides)
    path = Path(config_file).expanduser().resolve()
    if not path.is_file():
        raise FileNotFoundError(f"xrpo verl: config file {config_file} does not exist")
    if path.suffix not in (".yaml", ".yml"):
        raise ValueError(f"xrpo verl: config file {config_file} must be a .yaml file")
    with initialize_config_dir(config_dir=str(path.parent), version_base=None):
        return compose(config_name=path.stem, overrides=overrides)


def config_error(e: BaseException, config_file: str | os.PathLike | None = None, overrides: Sequence[str] = ()) -> str:
    """One line for an error composing or checking a config (hydra, OmegaConf, or verl's own checks, which assert, or
    raise inside hydra's instantiation of verl's config dataclasses): its first line; for an instantiation, the key
    and the error that hydra wraps. An override of a key the config does not have gets the nearest key there
    (`nearest_key`; the config is composed again without that override to find it)."""
    lines = str(e).strip().splitlines() or [f"{type(e).__name__} in verl's config check"]
    if lines[0].startswith("Error in call to target") and e.__cause__ is not None:  # hydra's instantiate wrapper
        key = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("full_key:")), "")
        what = (str(e.__cause__).strip().splitlines() or [type(e.__cause__).__name__])[0]
        return f"{key}: {what}" if key else what
    unknown = re.match(r"Could not override '([^']+)'", lines[0])
    if unknown is not None:
        key = unknown.group(1)
        try:
            config = load_config(config_file, [o for o in overrides if o.split("=", 1)[0].lstrip("~+") != key])
        except Exception:  # another override is wrong too: that one's error comes next time
            return lines[0]
        near = nearest_key(config, key)
        hint = f" did you mean {near}?" if near else ""
        return f"{lines[0]} The config has no key {key};{hint} (a new key is added with +{key}=VALUE)"
    return lines[0]


def nearest_key(config: DictConfig, key: str) -> str | None:
    """The key of ``config`` nearest to dotted ``key``, which it lacks: its parts are followed while they exist, and
    the first missing one is replaced by the closest name at that level (`difflib`); None when none is close."""
    import difflib

    node, found = config, []
    for part in key.split("."):
        names = [str(k) for k in node.keys()] if isinstance(node, DictConfig) else []
        if part in names:
            found.append(part)
            node = node[part]
            continue
        close = difflib.get_close_matches(part, names, n=1, cutoff=0.6)
        return ".".join([*found, close[0]]) if close else None
    return None


def check_data_files(config: DictConfig) -> None:
    """``data.train_files`` and ``data.val_files`` that name local files exist (a remote one, ``hdfs://``, is verl's
    to fetch): what `xrpo verl` checks before it starts Ray, and `--check` before it says the config is OK."""
    for key in ("train_files", "val_files"):
        value = config.data.get(key, None)
        for path in [value] if isinstance(value, str) else list(value or []):
            if "://" not in str(path) and not Path(str(path)).expanduser().exists():
                raise FileNotFoundError(
                    f"data.{key}: {path} does not exist (examples/verl/prepare_data.py writes verl's parquet from "
                    "your problems: docs/verl.md)"
                )


def check_config(config: DictConfig):
    """verl's checks, then XRPO's (`validate_xrpo_config`); returns the `XRPOConfig`. Needs no GPU."""
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
    from verl.utils.device import auto_set_device

    from xrpo.integrations.verl.config import validate_xrpo_config

    auto_set_device(config)
    xcfg = validate_xrpo_config(config)
    validate_config(config=config, use_reference_policy=need_reference_policy(config), use_critic=need_critic(config))
    return xcfg


def _base_runner():
    from verl.trainer.main_ppo_v0 import BaseTaskRunner

    return BaseTaskRunner


@ray.remote
class XRPOTaskRunner(_base_runner()):
    """verl's task runner (worker roles, resource pools, datasets) driving `RayXRPOTrainer`."""

    def run(self, config):
        from verl.trainer.ppo.utils import create_rl_dataset, create_rl_sampler
        from verl.utils.config import omega_conf_to_dataclass
        from verl.utils.dataset.rl_dataset import collate_fn

        import xrpo
        from xrpo.integrations.verl.trainer import RayXRPOTrainer

        print(f"XRPOTaskRunner on {socket.gethostname()}, pid {os.getpid()}, xrpo from {Path(xrpo.__file__).parent}")
        OmegaConf.resolve(config)
        _, worker_group_cls = self.add_actor_rollout_worker(config)
        self.add_reward_model_resource_pool(config)
        self.add_teacher_model_resource_pool(config)
        check_config(config)
        model_config = omega_conf_to_dataclass(config.actor_rollout_ref.model)
        tokenizer, processor = model_config.tokenizer, model_config.processor
        train = create_rl_dataset(
            config.data.train_files,
            config.data,
            tokenizer,
            processor,
            is_train=True,
            max_samples=config.data.get("train_max_samples", -1),
        )
        val = create_rl_dataset(
            config.data.val_files,
            config.data,
            tokenizer,
            processor,
            is_train=False,
            max_samples=config.data.get("val_max_samples", -1),
        )
        trainer = RayXRPOTrainer(
            config=config,
            tokenizer=tokenizer,
            processor=processor,
            role_worker_mapping=self.role_worker_mapping,
            resource_pool_manager=self.init_resource_pool_mgr(config),
            ray_worker_group_cls=worker_group_cls,
            train_dataset=train,
            val_dataset=val,
            collate_fn=collate_fn,
            train_sampler=create_rl_sampler(config.data, train),
        )
        trainer.init_workers()
        trainer.fit()


def run(config: DictConfig) -> None:
    """Check the config, then train with verl's Ray launcher and `XRPOTaskRunner`."""
    from verl.trainer.main_ppo import run_ppo

    check_config(config)
    check_data_files(config)
    run_ppo(config, task_runner_class=XRPOTaskRunner)


@hydra.main(config_path="config", config_name=CONFIG_NAME, version_base=None)
def main(config: DictConfig) -> None:
    run(config)


if __name__ == "__main__":
    sys.exit(main())
