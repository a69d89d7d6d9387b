"""Settings that only go wrong on a GPU node, refused before any model loads.

Each check reads the trainer arguments TRL will actually receive (``RLOOConfig`` / ``GRPOConfig``), so it
holds whatever way the config maps onto them, and names the setting to change:

- **bf16 weights without master weights.** A full fine-tune of a policy loaded in bf16/fp16 with plain
  AdamW (one GPU, DDP) updates the weights in that dtype: at lr 1e-6 most updates are below half an ulp
  and round away, so the run trains nothing and says nothing. DeepSpeed ZeRO keeps float32 master weights
  (so does LoRA: PEFT creates the adapters in float32), so those are allowed.
- **vLLM rollouts without vLLM.** TRL imports vLLM only once the trainer is built, after the policy has
  loaded; we say which extra to install before that.
- **A vLLM server on a verifier's port.** In server mode TRL sends rollouts and weight updates to
  ``vllm_server_port`` (default 8000, the port the presets give the verifier and the judge): a clash
  would send the policy's generation requests to the verifier.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlparse

from captionrl.errors import ConfigError

LOCAL_HOSTS = {"127.0.0.1", "localhost", "0.0.0.0", "::1", ""}


def check_gpu_settings(args: Any, policy: Any, servers: Sequence[tuple[Any, str]] = ()) -> None:
    """Every check below, in order; ``servers`` are the (BackendConfig, config field) pairs the run probes."""
    check_master_weights(args, policy)
    check_vllm(args)
    check_vllm_port(args, servers)


def uses_deepspeed(args: Any) -> bool:
    """DeepSpeed drives this run (``accelerate launch`` with a DEEPSPEED config, or ``train.deepspeed``)."""
    return getattr(args, "deepspeed_plugin", None) is not None or bool(getattr(args, "deepspeed", None))


def check_master_weights(args: Any, policy: Any) -> None:
    """Refuse a full fine-tune of half-precision weights that nothing keeps a float32 master of."""
    dtype = getattr(policy, "dtype", None)
    if dtype not in ("bfloat16", "float16") or getattr(policy, "lora", False) or uses_deepspeed(args):
        return
    raise ConfigError(
        "policy.dtype", dtype,
        "full fine-tuning of half-precision weights without master weights: AdamW would update the "
        f"{dtype} weights in place and at train.learning_rate={args.learning_rate} most updates round "
        "away (the run would train nothing, silently)",
        "launch under DeepSpeed, which keeps float32 master weights (accelerate launch --config_file "
        "configs/accelerate/multi-gpu-zero2.yaml ...), or set policy.dtype: float32 (train.bf16 still computes "
        "in bf16), or train LoRA adapters (policy.lora: true)",
    )


def vllm_installed() -> bool:
    return importlib.util.find_spec("vllm") is not None


def check_vllm(args: Any) -> None:
    """vLLM rollouts need the package and a GPU; say so before the policy loads."""
    if not getattr(args, "use_vllm", False):
        return
    if getattr(args, "use_cpu", False):
        raise ConfigError("train.use_vllm", True, "vLLM rollouts need a CUDA GPU and this run trains on the CPU",
                          "set train.use_vllm: false on a CPU machine (the policy then generates with transformers)")
    if not vllm_installed():
        raise ConfigError("train.use_vllm", True, "vLLM is not installed",
                          "install the gpu extra (pip install -e '.[gpu]', or scripts/setup.sh --gpu), "
                          "or set train.use_vllm: false")
    if args.vllm_mode not in ("colocate", "server"):
        raise ConfigError("train.vllm_mode", args.vllm_mode, "unknown vLLM mode",
                          "use colocate (vLLM shares the training GPUs) or server (trl vllm-serve on GPUs of its own)")


def vllm_server_address(args: Any) -> tuple[str, int]:
    """(host, port) TRL's vLLM client connects to in server mode."""
    if getattr(args, "vllm_server_base_url", None):
        url = urlparse(args.vllm_server_base_url)
        return url.hostname or "", url.port or (443 if url.scheme == "https" else 80)
    return str(args.vllm_server_host), int(args.vllm_server_port)


def server_address(base_url: str) -> tuple[str, int] | None:
    """(host, port) of an OpenAI-compatible server's base URL, or ``None`` when it has none."""
    url = urlparse(base_url)
    if not url.hostname:
        return None
    return url.hostname, url.port or (443 if url.scheme == "https" else 80)


def _same_host(a: str, b: str) -> bool:
    return a == b or (a in LOCAL_HOSTS and b in LOCAL_HOSTS)


def check_vllm_port(args: Any, servers: Sequence[tuple[Any, str]]) -> None:
    """In server mode, TRL's vLLM server must not share an address with any verifier or judge server."""
    if not (getattr(args, "use_vllm", False) and args.vllm_mode == "server"):
        return
    host, port = vllm_server_address(args)
    for cfg, field in servers:
        addr = server_address(getattr(cfg, "base_url", None) or "")
        if addr is not None and addr[1] == port and _same_host(addr[0], host):
            raise ConfigError(
                "train.vllm_server_port", port,
                f"is also the port of {field} ({cfg.base_url}): TRL would send the policy's rollouts and weight "
                "updates to that server",
                "start trl vllm-serve on a free port and set train.vllm_server_port to it (the presets use 8010)",
            )
