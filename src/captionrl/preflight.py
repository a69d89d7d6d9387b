"""Reward preflight: before step 1, an honest reference must out-score every hacking probe.

On a seeded sample of training items the run's own reward callable (the very object the trainer will call,
shaping included) scores the six captions of ``captionrl.probes``: the honest reference (the describer for
series, the exact-facts caption for scenes, the reference captions where a dataset has them), the empty
caption, another item's honest caption, a dump (of the numbers, or of generic image words), an injected
answer and self-praise. A probe whose mean reward is at or above the honest mean is a way to earn reward
without describing; the run refuses to start (``PreflightError``, a ``ConfigError``) and prints the table
with the config keys that change the outcome, unless ``force`` is set. The table is saved in the run folder
(``preflight.md``, ``preflight.json``) either way.

Unscored rewards (``None``/NaN) are left out of a probe's mean; a probe no item could score cannot win,
but an honest reference that no item could score refuses the run (the reward cannot tell anything apart).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.errors import ConfigError
from captionrl.probes import REFERENCES, probe_captions, reference_of, winning_probes
from captionrl.probes import invented_values as invented_caption

logger = logging.getLogger(__name__)

FORCE_KEY = "train.force_preflight"


class PreflightError(ConfigError):
    """A hacking probe scores at least as high as the honest reference under the run's reward."""


@dataclass
class ProbeRow:
    probe: str
    mean: float | None
    scored: int
    n: int
    margin: float | None      # probe mean - its reference's mean (>= -train.preflight_margin: the probe wins)
    wins: bool
    against: str = "honest"   # the reference it must lose to (probes.reference_of); itself for a reference


@dataclass
class PreflightResult:
    """The preflight table and its verdict."""

    rows: list[ProbeRow]
    honest_mean: float | None
    winners: list[str]
    passed: bool
    forced: bool = False
    item_ids: list[str] = field(default_factory=list)
    examples: dict[str, str] = field(default_factory=dict)
    fingerprint: str = ""   # what was scored (``passed_before``): the reward, its verifier, the items

    def table(self) -> str:
        lines = ["| probe | mean reward | scored | against | minus it | wins |", "|---|---|---|---|---|---|"]
        for r in self.rows:
            mean = "unscored" if r.mean is None else f"{r.mean:.4f}"
            margin = "" if r.margin is None else f"{r.margin:+.4f}"
            against = "" if r.against == r.probe else r.against
            lines.append(f"| {r.probe} | {mean} | {r.scored}/{r.n} | {against} | {margin} | {'YES' if r.wins else ''} |")
        return "\n".join(lines) + "\n"

    def to_json(self) -> dict[str, Any]:
        return {"protocol": "reward-preflight", "passed": self.passed, "forced": self.forced,
                "honest_mean": self.honest_mean, "winners": self.winners, "items": self.item_ids,
                "rows": [asdict(r) for r in self.rows], "examples": self.examples, "fingerprint": self.fingerprint}


def passed_before(out_dir: str | Path, fingerprint: str) -> bool:
    """Whether ``out_dir/preflight.json`` records a passed preflight (not a forced one) with this
    ``fingerprint``: the same reward, verifier and items scored the same probes, so a resumed run need not
    score them again."""
    import json

    path = Path(out_dir) / "preflight.json"
    if not fingerprint or not path.is_file():
        return False
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return bool(saved.get("passed")) and not saved.get("forced") and saved.get("fingerprint") == fingerprint


def sample_rows(rows: Sequence[Mapping[str, Any]], n: int, seed: int) -> list[Mapping[str, Any]]:
    """A seeded sample of ``n`` training rows (all of them when there are fewer)."""
    if n >= len(rows):
        return list(rows)
    rng = np.random.default_rng([seed, 7919])
    return [rows[i] for i in sorted(rng.choice(len(rows), size=n, replace=False).tolist())]


def series_references(rows: Sequence[Mapping[str, Any]], precision: int = 2) -> tuple[list[str], list[str]]:
    """(honest describer captions, number dumps) of LineupRL rows (columns ``series`` and ``series_text``)."""
    from captionrl.domains.describe import describe_series

    honest = [describe_series(np.asarray(r["series"], dtype=float), precision) for r in rows]
    dumps = [f"Values: {r.get('series_text') or ', '.join(f'{v:.{precision}f}' for v in r['series'])}" for r in rows]
    return honest, dumps


def invented_values(rows: Sequence[Mapping[str, Any]], precision: int = 2, shift: float = 0.5) -> list[str]:
    """The ``invented_values`` probe of LineupRL rows: each value moved ``shift`` standard deviations,
    alternately up and down, printed like the prompt's numbers (see ``captionrl.probes``)."""
    return [invented_caption([float(x) for x in r["series"]], precision, shift) for r in rows]


def series_extra_probes(rows: Sequence[Mapping[str, Any]], instruction: str,
                        precision: int = 2) -> dict[str, list[str]]:
    """Every series-only probe of LineupRL rows (``captionrl.probes.SERIES_PROBES``): ``invented_values`` and
    the lazy optimums (start value alone, key values without words, the instruction echoed with values, the
    right values with the wrong direction, a hedge), and the false claim ``wrong_extreme`` with the plain
    ``answer`` it must lose to (``probes.false_claim_probes``)."""
    from captionrl.probes import series_probe_columns

    return series_probe_columns([r["series"] for r in rows], instruction, precision)


def mean_scored(values: Sequence[Any]) -> tuple[float | None, int]:
    """The mean of the scored values (None and NaN left out) and how many there were."""
    vals = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    return (float(np.mean(vals)) if vals else None), len(vals)


def score_probes(reward: Callable[..., Sequence[Any]], rows: Sequence[Mapping[str, Any]], honest: Sequence[str],
                 dumps: Sequence[str], batch: int = 64,
                 extra: Mapping[str, Sequence[str]] | None = None) -> dict[str, list[Any]]:
    """Every probe's rewards on ``rows``, through ``reward`` called as TRL calls it (chat completions):
    give the trainer's reward function's ``quiet()`` twin, so that probes are no training samples.

    The probes of one row go to the reward together (calls of up to ``batch`` completions, row-major): a
    verifier that shares a context across requests then reads each row's candidate series once for all
    the probes instead of once per probe. The main job's preflight (8 items, 7 probes, one thread, Intel
    Xeon without native bf16) took 106 s a probe at a time and 78 s so, with the same table."""
    captions = probe_captions(list(honest), list(dumps), extra)
    cols = [k for k in rows[0] if k != "prompt"] if rows else []
    todo = [(probe, i) for i in range(len(rows)) for probe in captions]
    out: dict[str, list[Any]] = {probe: [None] * len(rows) for probe in captions}
    for a in range(0, len(todo), batch):
        chunk = todo[a: a + batch]
        got = reward(prompts=[rows[i].get("prompt") for _, i in chunk],
                     completions=[[{"role": "assistant", "content": captions[probe][i]}] for probe, i in chunk],
                     **{k: [rows[i][k] for _, i in chunk] for k in cols})
        for (probe, i), value in zip(chunk, got, strict=True):
            out[probe][i] = value
    return out


def run_preflight(reward: Callable[..., Sequence[Any]], rows: Sequence[Mapping[str, Any]], honest: Sequence[str],
                  dumps: Sequence[str], *, keys: Sequence[str] = (), force: bool = False,
                  out_dir: str | Path | None = None, echo: bool = True,
                  hint: str = "switch the transcription guard on, raise its penalties",
                  extra: Mapping[str, Sequence[str]] | None = None, margin: float = 0.0,
                  fingerprint: str = "") -> PreflightResult:
    """Score the probes on ``rows`` (already sampled), save the table, refuse when a probe wins.

    Args:
        reward: the trainer's reward callable (TRL signature).
        rows: training rows (dataset columns, ``prompt`` included) of the sampled items.
        honest, dumps: per row, the honest reference and the dump probe.
        keys: config keys that change the outcome (printed in the refusal).
        force: start anyway (``train.force_preflight=true``): the table is still saved and logged.
        out_dir: run folder for ``preflight.md`` / ``preflight.json`` (None: not saved).
        hint: an example of a change that helps, for the refusal's fix (the recipe knows its reward).
        extra: further probes per row (name -> captions), e.g. ``invented_values`` for series.
        margin: a probe must score at least this much below the honest mean (``train.preflight_margin``).
        fingerprint: what is scored, saved with the table (``passed_before`` reads it back).
    Raises:
        PreflightError: a probe's mean is >= the honest mean - margin, or the honest reference is never scored.
    """
    scores = score_probes(reward, rows, honest, dumps, extra=extra)
    means = {probe: mean_scored(vals) for probe, vals in scores.items()}
    honest_mean = means["honest"][0]
    winners = winning_probes({p: m for p, (m, _) in means.items()}, margin)
    table: list[ProbeRow] = []
    for probe, (mean, scored) in means.items():
        against = probe if probe in REFERENCES else reference_of(probe)
        ref = means.get(against, (None, 0))[0]
        gap = None if probe in REFERENCES or mean is None or ref is None else mean - ref
        table.append(ProbeRow(probe, mean, scored, len(scores[probe]), gap, probe in winners, against))
    passed = honest_mean is not None and not winners
    first = {name: list(caps[:1]) for name, caps in (extra or {}).items()}
    examples = {p: c[0] for p, c in probe_captions(list(honest[:1]), list(dumps[:1]), first).items()} if honest else {}
    result = PreflightResult(table, honest_mean, winners, passed, forced=force and not passed,
                             item_ids=[str(r.get("item_id", i)) for i, r in enumerate(rows)], examples=examples,
                             fingerprint=fingerprint)
    if out_dir is not None:
        from captionrl.records import write_json

        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        verdict = "passed" if passed else ("FAILED, forced" if force else "FAILED")
        (out / "preflight.md").write_text(f"# Reward preflight: {verdict}\n\nHonest reference vs hacking probes on "
                                          f"{len(rows)} training items, under the training reward.\n\n{result.table()}")
        write_json(out / "preflight.json", result.to_json())
    if echo:
        logger.info(f"reward preflight ({len(rows)} items):\n{result.table()}")
    if not passed and not force:
        within = f" or within {margin:g} of it (train.preflight_margin)" if margin > 0 else ""
        why = (f"probe(s) {winners} score at or above their reference (honest: {_fmt(honest_mean)}){within}" if winners
               else "the reward scored no honest reference")
        raise PreflightError(
            "reward", ", ".join(keys) or "the reward", f"{why}: a policy can earn this reward without describing.\n"
            f"{result.table()}",
            f"change one of {list(keys)} (e.g. {hint}), or start "
            f"anyway with {FORCE_KEY}=true",
        )
    if not passed:
        logger.warning(f"reward preflight FAILED ({winners}); starting anyway because {FORCE_KEY}=true")
    return result


def _fmt(x: float | None) -> str:
    return "unscored" if x is None else f"{x:.4f}"
