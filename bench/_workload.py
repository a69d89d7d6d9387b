"""The identification workload the benches share: G captions per item against K candidates, as a
LineupRL step asks it (letter mode: K rotations per caption, the prompts of one group sharing a prefix).

Also a path to the test suite's llama.cpp server helper, so benches start servers exactly as tests do.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def groups(items: int, g: int, k: int, length: int, seed: int = 0) -> tuple[list[str], list[list[list[float]]]]:
    """``items`` series from the embedded corpus, each with K-1 nearest distractors and G distinct captions."""
    from captionrl.domains.candidates import mine_candidates
    from captionrl.domains.datasets import split_windows
    from captionrl.domains.describe import describe_series

    windows = split_windows("embedded", length)["train"]
    rng = np.random.default_rng(seed)
    chosen = [windows[i] for i in rng.choice(len(windows), items, replace=False)]
    by_id = {w.id: w for w in windows}
    sets = mine_candidates(chosen, windows, k=k, seed=seed, progress=False)
    captions, candidates = [], []
    for it, cs in zip(chosen, sets, strict=True):
        cands = [it.values.tolist(), *[by_id[d].values.tolist() for d in cs.distractor_ids]]
        base = describe_series(it)
        for j in range(g):
            other = describe_series(by_id[cs.distractor_ids[j % (k - 1)]])
            captions.append(base if j == 0 else f"{base} Sample {j}: {other}")
            candidates.append(cands)
    return captions, candidates


def letter_questions(captions: list[str], candidates: list[list[list[float]]], k: int) -> list[list[dict[str, Any]]]:
    """The identification judge's letter prompts (c2s, K rotations), in the judge's own order."""
    from captionrl.backends.base import option_letters
    from captionrl.judges.identification import LETTER_C2S, IdentifyConfig, _groups, render_values, rotation

    cfg = IdentifyConfig(mode="letter", k=k)
    labels = option_letters(k)
    prompts = []
    for group in _groups(candidates):
        for r in range(k):
            for row in group:
                texts = [render_values(v, cfg) for v in candidates[row][:k]]
                blocks = "\n".join(f"{labels[p]}: {texts[c]}" for p, c in enumerate(rotation(k, r)))
                body = LETTER_C2S.format(k=k, labels=", ".join(labels), blocks=blocks, caption=captions[row].strip())
                prompts.append([{"role": "user", "content": body}])
    return prompts


def llama_server_class() -> Any:
    """``tests/servers.py``'s ``LlamaServer`` (llama-cpp-python's server with the settings tests use)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from servers import LlamaServer

    return LlamaServer


def cpu_line() -> str:
    """The CPU model and its bf16 support, for the bench's header."""
    from captionrl.devices import cpu_flags, cpu_native_bf16

    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.partition(":")[2].strip()
                break
    except OSError:
        pass
    import os

    bf16 = [f for f in ("avx512_bf16", "amx_bf16") if f in cpu_flags()]
    return (f"CPU: {model}, {os.cpu_count()} cores visible, bf16 flags: {bf16 or 'none'} "
            f"(native bf16: {cpu_native_bf16()[0]})")


def ref_tree(ref: str, out: Path) -> Path:
    """``ref``'s ``src`` and ``configs`` extracted under ``out`` with ``git archive`` (no git state of this
    checkout is touched), for a bench's side that runs another commit's code and config."""
    import subprocess

    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", f"{ref}^{{commit}}"], capture_output=True,
                            text=True, check=False)
    if commit.returncode != 0:
        raise SystemExit(f"--ref {ref}: not a commit of this repository ({commit.stderr.strip()})")
    dest = out / f"ref-src-{commit.stdout.strip()}"
    if not (dest / "src").is_dir():
        dest.mkdir(parents=True, exist_ok=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "src", "configs"], capture_output=True,
                                 check=False)
        if archive.returncode != 0:
            raise SystemExit(f"--ref {ref}: git archive failed ({archive.stderr.decode().strip()})")
        subprocess.run(["tar", "-x", "-C", str(dest)], input=archive.stdout, check=True)
    return dest


def add_ref_flags(ap: argparse.ArgumentParser, what: str, overrides: bool = True) -> None:
    """``--ref REF`` (required: the commit the bench compares this checkout with) and, with ``overrides``,
    ``--overrides`` (``key=value`` settings for this checkout's side)."""
    ap.add_argument("--ref", dest="ref", required=True,
                    help=f"commit, tag or branch of this repository to compare with ({what})")
    if overrides:
        ap.add_argument("--overrides", nargs="*", default=[], metavar="KEY=VALUE",
                        help="settings for this checkout's side only, e.g. train.beta=0.0")


def record_result(bench: str, flags: str, output: str, wall_s: float | None = None,
                  path: str | Path | None = None) -> None:
    """Append one run's printed output to ``path`` (the bench's ``--record FILE``) under a dated heading
    naming the command, so a figure a person keeps has the command and the machine beside it. The command
    names ``OMP_NUM_THREADS`` where it is set (it changes the figures); ``wall_s``, the run's wall time,
    follows it. Nothing is written without a path: a bench prints its results and a person chooses what to
    record in docs/results/."""
    import datetime
    import os

    if path is None:
        return
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    threads = os.environ.get("OMP_NUM_THREADS")
    command = f"{f'OMP_NUM_THREADS={threads} ' if threads else ''}{bench} {flags}".strip()
    wall = f" ({wall_s:.0f} s wall)" if wall_s is not None else ""
    block = f"\n## {stamp}: `{command}`{wall}\n\n```\n{output.rstrip()}\n```\n"
    with Path(path).open("a") as f:
        f.write(block)


def add_record_flag(ap: argparse.ArgumentParser) -> None:
    """The benches' ``--record FILE``: also append what was printed to FILE; by default a bench only prints."""
    ap.add_argument("--record", metavar="FILE", default=None,
                    help="also append what the bench printed, under its command and wall time, to FILE "
                         "(default: print only)")


class Printed:
    """A bench's printed lines, kept so that the bench can append exactly what it printed to its
    ``--record`` file (``record_result``) when it ends: call it as ``print`` with one string."""

    def __init__(self, bench_file: str, argv: list[str] | None = None) -> None:
        self.bench = Path(bench_file).name
        self.flags = " ".join(sys.argv[1:] if argv is None else argv)
        self.lines: list[str] = []

    def __call__(self, text: str = "") -> None:
        print(text, flush=True)
        self.lines.append(text)

    def record(self, args: argparse.Namespace) -> None:
        """Append the lines printed so far, with the process's wall time, to ``--record`` FILE if one was given."""
        if args.record is None:
            return
        import time

        import psutil

        wall = time.time() - psutil.Process().create_time()
        record_result(self.bench, self.flags, "\n".join(self.lines), wall, args.record)
