"""The default test tier of a given commit against this checkout's, each from a clean clone, one after the
other in one run: wall time, CPU time, counts and their ratio.

Each side is ``git clone``d from this repository into a temporary folder at its commit (``--ref`` for the
reference side, ``--new_ref``, HEAD by default, for the new one: commit first), and runs ``python -m pytest -q
-p no:cacheprovider`` there with the clone's own ``pyproject.toml`` options and its own ``src`` first on
``PYTHONPATH``, under this checkout's virtual environment (``scripts/setup.sh --dev``; its packages must cover
both commits). Setup is excluded from both times.

    .venv/bin/python bench/bench_suite.py --ref main --out /tmp/bench-suite
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _workload import ROOT, Printed, add_record_flag, add_ref_flags, cpu_line

SUMMARY = re.compile(r"^=*\s*(\d+ (?:passed|failed|error).*?) in ([\d.]+)s", re.MULTILINE)
"""pytest's last line, with ``-q`` (bare) or without (between ``=`` rules)."""


def clone(ref: str, dest: Path) -> Path:
    """A clean clone of this repository at ``ref`` (no untracked or ignored file comes along)."""
    subprocess.run(["git", "clone", "-q", "--no-checkout", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", ref], check=True)
    return dest


def run_suite(name: str, tree: Path, log: Path, timeout: float) -> dict:
    """The clone's default tier; wall and CPU seconds (``wait4``: pytest and its workers, reaped)."""
    env = {**os.environ, "PYTHONPATH": str(tree / "src")}
    env.pop("CAPTIONRL_LONG_TESTS", None)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    print(f"{name}: {' '.join(cmd[1:])} in {tree}", flush=True)
    t0 = time.perf_counter()
    before = os.times()
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, cwd=tree, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
    wall = time.perf_counter() - t0
    after = os.times()
    cpu = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    text = log.read_text(errors="replace")
    found = SUMMARY.findall(text)
    summary = found[-1][0] if found else f"no pytest summary (exit {rc}); see {log}"
    return {"name": name, "rc": rc, "wall_s": wall, "cpu_s": cpu, "summary": summary}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_ref_flags(ap, "its default test tier is the reference side", overrides=False)
    ap.add_argument("--new_ref", default="HEAD", help="the new side's commit (default: %(default)s)")
    ap.add_argument("--out", default=None, help="keep the clones and logs here (default: a temporary folder)")
    ap.add_argument("--timeout", type=float, default=3600.0, help="seconds per suite before it is killed")
    add_record_flag(ap)
    args = ap.parse_args()
    refs = {"ref": args.ref, "new": args.new_ref}
    commits = {k: subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", v], capture_output=True,
                                 text=True, check=True).stdout.strip() for k, v in refs.items()}
    say = Printed(__file__)
    say(cpu_line())
    say(f"default test tier from clean clones, one after the other: ref {commits['ref']}, new {commits['new']}")
    with tempfile.TemporaryDirectory(prefix="bench-suite-") as tmp:
        out = Path(args.out) if args.out else Path(tmp)
        out.mkdir(parents=True, exist_ok=True)
        results = []
        for name in ("ref", "new"):
            tree = clone(commits[name], out / f"{name}-{commits[name]}")
            results.append(run_suite(name, tree, out / f"{name}.log", args.timeout))
            say(f"{name}: {results[-1]['wall_s']:.0f} s wall, {results[-1]['cpu_s']:.0f} s CPU: {results[-1]['summary']}")
    ref, new = results
    say()
    say(f"wall time new/ref: {new['wall_s'] / ref['wall_s']:.2f}x; CPU time new/ref: {new['cpu_s'] / ref['cpu_s']:.2f}x")
    if any(r["rc"] != 0 for r in results):
        say("a suite failed: " + ", ".join(f"{r['name']} exit {r['rc']}" for r in results if r["rc"] != 0))
    say.record(args)
    sys.exit(0 if all(r["rc"] == 0 for r in results) else 1)


if __name__ == "__main__":
    main()
