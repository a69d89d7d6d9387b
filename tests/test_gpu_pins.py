"""The GPU path under the versions a GPU install gets (``scripts/gpu-pins.txt``), and the GPU install itself
where a CPU can check it.

``pip install -e .[gpu]`` resolves transformers 5.17 and xgrammar 0.2.7 (vLLM 0.31 pins them) where the
CPU install takes 5.24 and 0.2.9. ``scripts/setup.sh --dev`` installs the pinned versions of those packages
into ``.venv/gpu-pins`` (``pip --target``); the first test here runs every test marked ``gpu_pins`` (the
GPU-path joints that need no CUDA) in a pytest subprocess with that folder first on ``PYTHONPATH``, and the
GPU smoke test's MoCo joint under it (every joint in the long tier), so the README's test command covers both
ends of the declared transformers range. torch and torchvision are
not overlaid (PyPI's torch 2.13.0 is the CUDA build; PyPI's torchvision does not import beside a CPU torch):
what depends on them is checked on a GPU only (``scripts/gpu_smoke.sh``).

The other tests run ``scripts/setup.sh --gpu`` where no usable GPU is: it must refuse before it changes
anything, in one line that says the fix.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from deepspeed_launch import requires_deepspeed, run_group
from servers import requires_llama_cpp

ROOT = Path(__file__).resolve().parents[1]
PINS = ROOT / "scripts" / "gpu-pins.txt"
OVERLAY_ENV = "CAPTIONRL_GPU_PINS_OVERLAY"


def overlay_pins() -> dict[str, str]:
    """``{name: version}`` of the pins file's lines marked ``cpu-overlay`` (what setup.sh --dev installs)."""
    pins = {}
    for line in PINS.read_text().splitlines():
        if line.startswith("#") or "cpu-overlay" not in line:
            continue
        name, version = line.split("#", 1)[0].strip().split("==")
        pins[name] = version
    return pins


def overlay_dir() -> Path:
    """``.venv/gpu-pins`` of the venv running the tests (``$CAPTIONRL_GPU_PINS_OVERLAY`` to point elsewhere)."""
    return Path(os.environ.get(OVERLAY_ENV) or Path(sys.prefix) / "gpu-pins")


def test_pins_hold_the_versions_vllm_requires():
    """The pins file is the one place the GPU versions are written: vLLM 0.31.0 and what it pins."""
    import tomllib

    pins = {n: v for n, v in (line.split("#", 1)[0].strip().split("==") for line in PINS.read_text().splitlines()
                              if line.strip() and not line.startswith("#"))}
    assert pins["vllm"] == "0.31.0" and pins["torch"] == "2.13.0" and pins["xgrammar"] == "0.2.7"
    assert pins["transformers"].startswith("5.17.")  # vLLM 0.31: transformers<5.18
    assert set(overlay_pins()) == {"transformers", "xgrammar", "apache-tvm-ffi", "huggingface-hub", "numpy"}
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    transformers = next(d for d in deps if d.startswith("transformers"))
    assert transformers == f"transformers>={pins['transformers'].rsplit('.', 1)[0]},<5.25"  # the tested ends


def overlay_env() -> dict[str, str]:
    """The environment with the overlay first on ``PYTHONPATH``, checked to hold the pinned versions; skips
    (fails under CI) where ``setup.sh --dev`` has not built the overlay."""
    overlay = overlay_dir()
    wanted = overlay_pins()
    if not (overlay / "transformers").is_dir():
        message = (f"no gpu-pins overlay in {overlay}. Fix: bash scripts/setup.sh --dev builds it (or set "
                   f"{OVERLAY_ENV} to a folder made by pip install --no-deps --target DIR <the cpu-overlay lines>)")
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(overlay), os.environ.get("PYTHONPATH")) if p)}
    env.pop("CAPTIONRL_TEST_CACHE", None)  # a cache of its own: every tiny model is built by the pinned versions
    probe = ("import json; from importlib import metadata as m; "
             f"print(json.dumps({{n: m.version(n) for n in {sorted(wanted)!r}}}))")
    got = json.loads(subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True,
                                    check=True).stdout)
    assert got == wanted, f"{overlay} is stale: rerun bash scripts/setup.sh --dev"
    return env


@pytest.mark.timeout(1800)
def test_gpu_path_tests_pass_under_the_gpu_extras_versions():
    env = overlay_env()
    files = sorted(str(p) for p in (ROOT / "tests").glob("test_*.py") if "mark.gpu_pins" in p.read_text())
    run = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu_pins", "-n", "0", "-q", "-p", "no:cacheprovider",
                          *files], env=env, cwd=ROOT, capture_output=True, text=True, timeout=1700)
    tail = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, tail
    counts = dict((k, int(n)) for n, k in re.findall(r"(\d+) (passed|failed|skipped|error)", run.stdout.splitlines()[-1]))
    assert counts.get("passed", 0) >= 10 and not counts.get("skipped"), tail


def _smoke_under_pins(tmp_path: Path, models: tuple[str, ...], only: tuple[str, ...] = ()) -> dict:
    """``scripts/gpu_smoke.sh --cpu-rehearsal`` (``--only`` these joints) under the pinned versions, in a cache of
    its own so the tiny models are built by them too; its report, every joint passed."""
    env = {**overlay_env(), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1", "CAPTIONRL_CACHE": str(tmp_path / "cache")}
    build = f"from captionrl.tiny_models import tiny_qwen_vl_dir; [tiny_qwen_vl_dir(f) for f in {models!r}]"
    subprocess.run([sys.executable, "-c", build], env=env, check=True, timeout=600)  # once, not raced by the joints
    out = tmp_path / "smoke"
    returncode, output = run_group(["bash", str(ROOT / "scripts" / "gpu_smoke.sh"), "--cpu-rehearsal", "--out", str(out),
                                    "--timeout", "600", *(["--only", *only] if only else [])], env, timeout=2300)
    assert returncode is not None, output[-12000:]
    report = json.loads((out / "report.json").read_text())
    failed = {j["name"]: j["tail"] for j in report["joints"] if not j["passed"]}
    assert returncode == 0 and not failed, (output[-2000:], failed)
    return report


@pytest.mark.slow
@pytest.mark.timeout(1200)
@requires_deepspeed
def test_gpu_smoke_moco_joint_passes_under_the_gpu_extras_versions(tmp_path):
    """The cheapest recipe joint of the GPU smoke test under the pinned versions: MoCo (GRPO, a LoRA Policy, the
    momentum, a tiny Qwen3-VL) trained by ``captionrl train moco`` through ``accelerate launch``."""
    report = _smoke_under_pins(tmp_path, ("qwen3-vl",), only=("device", "moco"))
    assert [j["name"] for j in report["joints"]] == ["device", "moco"]
    assert not any(j.get("skipped") for j in report["joints"])


@pytest.mark.long  # every joint under the pinned versions: the moco joint above here, each joint under the CPU install's
# versions in the default tier (tests/test_launch.py, test_deepspeed_rehearsal.py, test_gpu_smoke.py's plan)
@pytest.mark.slow
@pytest.mark.timeout(2400)
@requires_deepspeed
@requires_llama_cpp
def test_gpu_smoke_cpu_rehearsal_passes_every_joint_under_the_gpu_extras_versions(tmp_path):
    """``scripts/gpu_smoke.sh --cpu-rehearsal`` as a whole (every joint of the GPU path but the device and vLLM)
    under the versions a GPU install resolves, the ones the script meets on a GPU: every joint passes, NCCL is
    skipped, each recipe trains its 2 steps, and the report and the output say it is NOT the GPU check."""
    from test_gpu_smoke import NAMES

    out = tmp_path / "smoke"
    report = _smoke_under_pins(tmp_path, ("qwen2.5-vl", "qwen3-vl"))
    assert [j["name"] for j in report["joints"]] == NAMES
    assert {j["name"]: j["result"] for j in report["joints"]}["nccl"] == "skip"
    assert report["rehearsal"] and report["device"].startswith("cpu") and report["date"]
    assert all(j["seconds"] > 0 for j in report["joints"] if j["result"] != "skip")
    assert "NOT the GPU check" in (out / "report.md").read_text()
    for recipe in ("lineup", "rubicap", "moco"):
        assert json.loads((out / recipe / "result.json").read_text())["steps"] == 2, recipe
    assert json.loads((out / "gpu_verifier.json").read_text())["tiny"]


def _path_without_nvidia_smi(tmp_path: Path, stub: str | None = None) -> str:
    """``PATH`` with no ``nvidia-smi`` on it, or with ``stub`` (a shell script's body) as ``nvidia-smi``."""
    dirs = [d for d in os.environ.get("PATH", "").split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    if stub is not None:
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        smi = bin_dir / "nvidia-smi"
        smi.write_text("#!/bin/sh\n" + stub)
        smi.chmod(0o755)
        dirs.insert(0, str(bin_dir))
    return os.pathsep.join(dirs)


def _freeze() -> str:
    return subprocess.run([sys.executable, "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                          check=True).stdout


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(("stub", "message"), [
    (None, r"no NVIDIA driver on this machine \(nvidia-smi not found\).*nothing was changed\. Fix: run it on a "
           r"machine with an NVIDIA GPU and driver >= 580\.65\.06; on a CPU machine use bash scripts/setup.sh --dev"),
    ("echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'; exit 9",
     r"nvidia-smi failed \(NVIDIA-SMI has failed because it could not communicate.*\); nothing was changed\. "
     r"Fix: load the NVIDIA driver"),
    ("echo '535.104.05, NVIDIA H100 80GB HBM3'",
     r"NVIDIA driver 535\.104\.05 is older than 580\.65\.06, which torch 2\.13\.0's CUDA 13\.0 build needs; "
     r"nothing was changed\. Fix: upgrade the driver.*; or, keeping this driver, install torch's CUDA 12\.8 build from "
     r"PyTorch's own index, which this node must reach: .*-m pip install torch==2\.13\.0 --index-url "
     r"https://download\.pytorch\.org/whl/cu128 .*train\.use_vllm=false"),
    ("echo '590.48.01, Tesla V100-SXM2-32GB'",
     r"Tesla V100-SXM2-32GB is a Volta GPU \(sm_70\), which CUDA 13\.0 builds .* no longer support; nothing was "
     r"changed\. Fix: use an Ampere or newer GPU .*; or install torch's CUDA 12\.8 build from PyTorch's own index"),
    ("echo 'No devices were found'",
     r"nvidia-smi lists no GPU \(it printed: No devices were found\); nothing was changed\. Fix:"),
])
def test_setup_gpu_refuses_without_a_usable_gpu_before_changing_anything(tmp_path, stub, message):
    """A copy of the repository's scripts (so a refusal that failed could not touch the checkout): exit 1, one
    line with the fix, no venv created, and the Python environment running the tests unchanged."""
    repo = tmp_path / "repo"
    (repo / "scripts").mkdir(parents=True)
    for name in ("setup.sh", "setup_gpu.sh", "gpu-pins.txt", "gpu_env_check.py"):
        shutil.copy(ROOT / "scripts" / name, repo / "scripts" / name)
    before_tree, before_freeze = _tree(repo), _freeze()
    env = {**os.environ, "PATH": _path_without_nvidia_smi(tmp_path, stub), "PYTHON": sys.executable}
    run = subprocess.run(["bash", str(repo / "scripts" / "setup.sh"), "--gpu"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 1, (run.stdout, run.stderr)
    lines = [line for line in (run.stdout + run.stderr).splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("setup.sh --gpu: "), lines
    assert re.search(message, lines[0]), lines[0]
    assert _tree(repo) == before_tree  # no .venv, no .venv-gpu
    assert _freeze() == before_freeze


def test_the_gpu_environment_check_names_a_cpu_torch_with_its_fix():
    """``scripts/gpu_env_check.py``, setup's last step, run here in the CPU environment: it must not pass."""
    run = subprocess.run([sys.executable, str(ROOT / "scripts" / "gpu_env_check.py"), str(PINS)],
                         capture_output=True, text=True, timeout=300)
    assert run.returncode == 1 and run.stdout == ""
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and re.fullmatch(r"setup\.sh --gpu: torch 2\.\d+\.\d+\+cpu is a CPU build, and vLLM needs "
                                            r"the CUDA build\. Fix: rm -rf \.venv-gpu && bash scripts/setup\.sh --gpu.*",
                                            lines[0]), lines
