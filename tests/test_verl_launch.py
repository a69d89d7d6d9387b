"""docs/engines.md's verl launch lines, read the way verl 0.9.1 reads them (verl is not installed here: its
reading is replayed from its source, the PyPI wheel verl-0.9.1, read 2026-12-03).

What is replayed, file and function:

- ``verl/trainer/main_ppo.py``, ``main``: Hydra composes ``config_name="ppo_trainer"``, applies the command
  line's overrides and hands the config to ``run_ppo``; with ``trainer.use_v1: true`` (the default) the
  trainer is ``TaskRunnerV1`` (else ``main_ppo_v0.TaskRunner``). Neither calls
  ``verl/experimental/reward_loop/reward_loop.py``'s ``migrate_legacy_reward_impl`` (only
  ``verl/experimental/fully_async_policy/fully_async_main.py`` does), so nothing copies the legacy keys.
- The config (``verl/trainer/config/_generated_ppo_trainer.yaml``): the defaults list takes
  ``legacy_reward_impl.yaml``, whose top-level ``custom_reward_function: {path: null, name: null}`` Hydra
  accepts and nothing in ``main_ppo`` reads, and ``reward/reward.yaml``, whose
  ``reward.custom_reward_function: {path: null, name: compute_score}`` has no ``reward_kwargs`` key;
  ``ray_kwargs.ray_init.runtime_env`` holds only ``py_executable``.
- Hydra's override rules on that (struct) config: ``key=value`` must name an existing key, ``+key=value``
  adds one that must not exist; a quoted value is a string, an unquoted number a number.
- ``verl/trainer/ppo/reward.py``, ``get_custom_reward_fn``: reads ``config.reward.custom_reward_function``'s
  ``path`` (``None`` without one: ``load_reward_manager`` then uses ``default_compute_score``, which raises
  ``NotImplementedError`` for a ``data_source`` it does not know), ``name`` and ``reward_kwargs``, loads the
  function with ``verl/utils/import_utils.py``'s ``load_extern_object`` / ``load_module`` (``pkg://a.b``
  imports module ``a.b``; anything else is a file path) and wraps it in ``partial(_call_with_kwargs[_async],
  raw_fn, reward_kwargs)`` (async when ``inspect.iscoroutinefunction``).
- ``verl/experimental/reward_loop/reward_loop.py``, ``RewardLoopWorker.compute_score``: the custom function
  runs when ``config.reward.custom_reward_function.path is not None``.
- Ray (``ray/_private/runtime_env/validation.py``, ``parse_and_validate_env_vars``): ``runtime_env``'s
  ``env_vars`` must be ``Dict[str, str]``.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import inspect
import re
import shlex
from functools import partial
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
ENGINES_DOC = ROOT / "docs" / "engines.md"

VERL_091_CONFIG: dict[str, Any] = {
    "data": {"train_files": "~/data/rlhf/gsm8k/train.parquet", "val_files": "~/data/rlhf/gsm8k/test.parquet"},
    "actor_rollout_ref": {"model": {"path": "~/models/deepseek-llm-7b-chat"}},
    "trainer": {"use_v1": True},
    "custom_reward_function": {"path": None, "name": None},  # legacy_reward_impl.yaml: read by nothing here
    "reward": {"num_workers": 8, "custom_reward_function": {"path": None, "name": "compute_score"},
               "reward_manager": {"source": "register", "name": "naive"}, "reward_model": {"enable": False}},
    "ray_kwargs": {"ray_init": {"num_cpus": None, "runtime_env": {"py_executable": None}},
                   "timeline_json_file": None},
}
"""The part of verl 0.9.1's composed ``ppo_trainer`` config that the launch lines touch (the module doc)."""


class HydraError(ValueError):
    pass


def _value(raw: str) -> Any:
    """A Hydra override value: quoted is a string; else null, a bool, an int, a float or a string."""
    if len(raw) >= 2 and raw[0] == raw[-1] and raw[0] in "'\"":
        return raw[1:-1]
    low = raw.lower()
    if low == "null":
        return None
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(raw)
        except ValueError:
            pass
    return raw


def hydra_apply(config: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """``config`` with ``overrides`` applied under Hydra's rules for a struct config (module doc)."""
    cfg = copy.deepcopy(config)
    for text in overrides:
        key, _, raw = text.partition("=")
        add = key.startswith("+")
        parts = key.lstrip("+").split(".")
        node = cfg
        for i, part in enumerate(parts[:-1]):
            if part not in node:
                if not add:
                    raise HydraError(f"Could not override '{key}'. To append to your config use +{key}={raw} "
                                     f"(key '{'.'.join(parts[:i + 1])}' is not in struct)")
                node[part] = {}
            node = node[part]
        leaf = parts[-1]
        if add and leaf in node:
            raise HydraError(f"Could not append to config. An item is already at '{key.lstrip('+')}'")
        if not add and leaf not in node:
            raise HydraError(f"Could not override '{key}'. To append to your config use +{key}={raw} "
                             f"(key '{key}' is not in struct)")
        node[leaf] = _value(raw)
    return cfg


def _load_module(module_path: str) -> Any:
    """``verl.utils.import_utils.load_module``: ``pkg://`` imports a module, anything else is a file."""
    if module_path.startswith("pkg://"):
        return importlib.import_module(module_path[len("pkg://"):].replace("/", "."))
    path = module_path.removeprefix("file://")
    if not Path(path).exists():
        raise FileNotFoundError(f"Custom module file not found: {module_path=}")
    spec = importlib.util.spec_from_file_location(f"custom_module_{hash(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def get_custom_reward_fn(config: dict[str, Any]) -> Any:
    """``verl.trainer.ppo.reward.get_custom_reward_fn`` (0.9.1): ``None`` means verl's default scorer."""
    reward_fn_config = config["reward"].get("custom_reward_function") or {}
    module_path = reward_fn_config.get("path")
    if not module_path:
        return None
    fn_name = reward_fn_config.get("name")
    assert fn_name is not None
    module = _load_module(module_path)
    if not hasattr(module, fn_name):
        raise AttributeError(f"Object not found in module: {fn_name=}, {module_path=}.")
    raw_fn = getattr(module, fn_name)
    reward_kwargs = dict(reward_fn_config.get("reward_kwargs", {}))
    if not inspect.iscoroutinefunction(raw_fn):
        return partial(_call_with_kwargs, raw_fn, reward_kwargs)
    return partial(_call_with_kwargs_async, raw_fn, reward_kwargs)


def _call_with_kwargs(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    return raw_fn(*args, **{**kwargs, **extra_kwargs})


async def _call_with_kwargs_async(raw_fn: Any, extra_kwargs: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
    return await raw_fn(*args, **{**kwargs, **extra_kwargs})


def launch_lines(doc: Path = ENGINES_DOC) -> list[list[str]]:
    """The overrides of every ``python -m verl.trainer.main_ppo`` command in the doc's code blocks."""
    lines = []
    for block in re.findall(r"```bash\n(.*?)```", doc.read_text(), flags=re.S):
        command = block.replace("\\\n", " ")
        for line in command.splitlines():
            if "verl.trainer.main_ppo" in line:
                words = shlex.split(line.split("verl.trainer.main_ppo", 1)[1])
                lines.append([w for w in words if "=" in w and not w.startswith("-")])
    return lines


def test_the_docs_verl_lines_reach_captionrls_reward_functions():
    from captionrl.adapters import verl as adapter
    from captionrl.serve import client

    lines = launch_lines()
    assert len(lines) == 2, lines  # against the service, and in process
    targets = []
    for overrides in lines:
        config = hydra_apply(VERL_091_CONFIG, overrides)
        assert config["reward"]["custom_reward_function"]["path"] is not None  # RewardLoopWorker: the custom fn
        compute_score = get_custom_reward_fn(config)
        assert compute_score is not None, overrides
        # NaiveRewardManager awaits it (inspect.iscoroutinefunction) rather than running it in a thread pool
        assert inspect.iscoroutinefunction(compute_score)
        targets.append(compute_score.args)  # (raw_fn, reward_kwargs)
        env = config["ray_kwargs"]["ray_init"]["runtime_env"].get("env_vars", {})
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()), env  # Ray's check
    (service_fn, service_kwargs), (inproc_fn, inproc_kwargs) = targets
    assert service_fn is client.compute_score_async and service_kwargs == {"url": "http://10.0.0.5:8000"}
    assert inproc_fn is adapter.compute_score_async and inproc_kwargs == {}
    env = hydra_apply(VERL_091_CONFIG, lines[1])["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]
    assert env["CAPTIONRL_REWARD_CONFIG"].endswith("reward.yaml") and env["CAPTIONRL_UNSCORED_REWARD"] == "0.0"


def test_the_old_top_level_keys_are_accepted_and_read_by_nothing():
    """The line docs/engines.md had before: Hydra takes it without a word (the legacy keys exist), and verl 0.9.1's
    main_ppo then scores with its default scorer: what the replay must tell apart from the lines above."""
    old = ["custom_reward_function.path=pkg://captionrl.serve.client",
           "custom_reward_function.name=compute_score_async",
           "+custom_reward_function.reward_kwargs.url=http://10.0.0.5:8000"]
    config = hydra_apply(VERL_091_CONFIG, old)
    assert config["custom_reward_function"]["path"] == "pkg://captionrl.serve.client"
    assert get_custom_reward_fn(config) is None  # verl's default_compute_score instead


@pytest.mark.parametrize(("override", "error"), [
    ("reward.custom_reward_function.reward_kwargs.url=http://h:1", "To append to your config use"),  # needs +
    ("+reward.custom_reward_function.path=pkg://captionrl.serve.client", "An item is already at"),
    ("ray_kwargs.ray_init.runtime_env.env_vars.X=1", "use \\+ray_kwargs.*'ray_kwargs.ray_init.runtime_env.env_vars' is not"),
    ("data.no_such_key=1", "To append to your config use"),
])
def test_hydra_replay_refuses_what_hydra_refuses(override, error):
    with pytest.raises(HydraError, match=error):
        hydra_apply(VERL_091_CONFIG, [override])


def test_a_number_for_a_ray_environment_variable_must_be_quoted():
    env = hydra_apply(VERL_091_CONFIG, ["+ray_kwargs.ray_init.runtime_env.env_vars.CAPTIONRL_UNSCORED_REWARD=0.0"])
    assert env["ray_kwargs"]["ray_init"]["runtime_env"]["env_vars"]["CAPTIONRL_UNSCORED_REWARD"] == 0.0  # a float


def test_no_file_names_the_old_top_level_keys_in_a_launch_line():
    old = re.compile(r"(?<![\w.])\+?custom_reward_function\.(path|name|reward_kwargs)")
    files = [ENGINES_DOC, ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
             *sorted((ROOT / "src" / "captionrl").rglob("*.py"))]
    stale = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in files for m in old.finditer(p.read_text())]
    assert not stale, stale
