"""``captionrl preflight``: a LineupRL config's reward on the honest reference, the hacking probes and, when
given, a captioner's own captions, before any training; with ``ablate``, which term each probe needs.

A training run refuses to start when a probe beats the honest reference (``captionrl.preflight``); this command
asks the same question without loading or training the policy, and two more:

- **Which terms are needed.** Each probe caption is judged once by the family's judge (the verifier's
  identification); the shaping is then applied again with one term switched off at a time (its weight set to
  0, or the identification weight ``reward.lam`` set to 0), and the table says which probes would then win;
  then, with the identification term on, the shaping terms are switched off one after another, each left off
  while no probe wins (``minimal_terms``: one minimal set, in the config's order). A term no probe needs is a
  term to justify by a measured run, or to drop.
- **Does the lineup still pay at RL's start point.** ``captioner`` names a model folder (a warm start's
  ``warm_start/model``, a checkpoint); it captions each sampled row ``samples`` times at the training
  temperature, as RL's first step does, and the table reports their reward and their identification, the
  verifier's mean probability on the true series (``soft``). A start point whose captions already score
  near 1 leaves the identification term nothing to pay for.

It reads the same config as ``captionrl train lineup`` (overrides included) and prints its tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tqdm.auto import tqdm

from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.probes import winning_probes
from captionrl.train.lineup_config import LineupConfig


@dataclass
class PreflightCommandConfig(LineupConfig):
    """A LineupRL config (``--config``), plus what to measure before training."""

    ablate: bool = help_field(True, "also re-score the probes with each reward term switched off, one at a time")
    captioner: str | None = help_field(None, "a model folder whose own captions are scored too (e.g. RUN/warm_start/model): does the lineup still pay at RL's start point")
    samples: int = help_field(4, "captions per row from the captioner, sampled at train.temperature as RL's first step samples")
    probes: bool = help_field(True, "score the honest reference and the hacking probes (false: only the captioner's captions, to measure a lineup quickly)")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.samples < 1:
            raise ConfigError("samples", self.samples, "must be >= 1", "set samples: 4")
        if not self.probes and not self.captioner:
            raise ConfigError("probes", False, "leaves nothing to score without a captioner",
                              "set probes: true, or name a captioner (captioner=RUN/warm_start/model)")


CONFIG = PreflightCommandConfig


def switchable_terms(spec: Any) -> list[str]:
    """The reward's terms that are on: every shaping weight above 0, the masked pass, the identification."""
    terms = [w for w in spec.WEIGHTS if getattr(spec, w) > 0]
    if getattr(spec, "masked_weight", 0) > 0:
        terms.append("masked_weight")
    return ["lam", *terms]


def _mean(values: Sequence[float | None]) -> float | None:
    from captionrl.preflight import mean_scored

    return mean_scored(values)[0]


def shaped_means(reward: Any, spec: Any, captions: Mapping[str, Sequence[str]], base: Mapping[str, Sequence[Any]],
                 masked: Mapping[str, Sequence[Any]] | None, rows: Sequence[Mapping[str, Any]]) -> dict[str, float | None]:
    """Each probe's mean reward under ``spec``'s shaping, from judge scores computed once (``base``; ``masked``
    for the numbers-masked pass). ``lam`` is applied by the judge, so a spec with ``lam`` 0 zeroes ``base``."""
    from captionrl.rewards.shaping import Shaper

    shaper = Shaper(spec, reward.shaper.instruction)
    lam_scale = spec.lam / reward.shaping.lam if reward.shaping.lam else 0.0
    out = {}
    for probe, caps in captions.items():
        n = len(caps)
        scale = [None if b is None else b * lam_scale for b in base[probe]]
        m = [None if b is None else b * lam_scale for b in masked[probe]] if masked is not None else None
        shaped = shaper.shape(list(caps), scale, [r["series"] for r in rows][:n], [r.get("series_text") for r in rows][:n], m)
        out[probe] = _mean([s.reward for s in shaped])
    return out


def captioner_captions(cfg: PreflightCommandConfig, rows: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """``cfg.samples`` captions per row from ``cfg.captioner`` at the training temperature."""
    from captionrl.backends import ChatRequest
    from captionrl.backends.hf import HFBackend
    from captionrl.train.run.loading import load_policy

    model, processing, _ = load_policy(dataclasses.replace(cfg.policy, model=str(cfg.captioner)))
    model.eval()
    backend = HFBackend.from_model(model, processing, name="captioner", batch_size=8)
    reqs = [ChatRequest(messages=r["prompt"], max_new_tokens=cfg.train.max_completion_length,
                        temperature=cfg.train.temperature, seed=cfg.seed * 1000 + j)
            for r in rows for j in range(cfg.samples)]
    texts = [g.text or "" for g in backend.generate(reqs)]
    return [texts[i * cfg.samples:(i + 1) * cfg.samples] for i in range(len(rows))]


def run_command(cfg: PreflightCommandConfig) -> int:
    from captionrl.backends import make_backend
    from captionrl.domains.lineup_data import build_lineup_data
    from captionrl.preflight import sample_rows, series_extra_probes, series_references
    from captionrl.probes import FALSE_CLAIM_PROBES, probe_captions, reference_of
    from captionrl.rewards.reward import build_reward
    from captionrl.train.run.loading import apply_threads

    apply_threads(cfg.train.threads)
    data = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed)
    rows = sample_rows(data.rows["train"], max(cfg.train.preflight_items, 1), cfg.seed)
    honest, dumps = series_references(rows, cfg.data.precision)
    captions = probe_captions(honest, dumps, series_extra_probes(rows, cfg.instruction(), cfg.data.precision)) \
        if cfg.probes else {}
    if cfg.captioner:  # every caption is judged once: a captioner's samples are one column per sample index
        per_row = captioner_captions(cfg, rows)
        captions.update({f"captioner[{j}]": [caps[j] for caps in per_row] for j in range(cfg.samples)})
    reward = build_reward(cfg.reward, make_backend(cfg.verifier), series=cfg.series_print(), seed=cfg.seed,
                          name="lineup", series_rows=True, instruction=cfg.instruction())
    cols = [k for k in rows[0] if k != "prompt"]
    flat = [(p, i) for p in captions for i in range(len(rows))]
    columns = {k: [rows[i][k] for _, i in flat] for k in cols}
    judged = []
    batch = 8 * len(rows)  # several probes of the same rows per call: a verifier reads their candidates once
    for a in tqdm(range(0, len(flat), batch), desc="preflight: scoring", unit="batch"):
        judged += reward.score([captions[p][i] for p, i in flat[a:a + batch]],
                               {k: v[a:a + batch] for k, v in columns.items()})
    def per_probe(values: Sequence[Any]) -> dict[str, list[Any]]:
        out: dict[str, list[Any]] = {p: [] for p in captions}
        for (p, _), v in zip(flat, values, strict=True):
            out[p].append(v)
        return out

    base = per_probe([j.extra.get("base") if j.scored else None for j in judged])
    soft = per_probe([j.extra.get("soft") for j in judged])
    masked = per_probe([j.extra.get("masked") for j in judged]) if cfg.reward.masked_weight > 0 else None
    full = {p: _mean(scores) for p, scores in per_probe([j.score for j in judged]).items()}
    margin = cfg.train.preflight_margin
    print(f"reward preflight of {len(rows)} training rows (K={cfg.reward.k}, {cfg.reward.mode}, "
          f"pinned distractors: {cfg.data.pin_endpoints})\n")
    lam = cfg.reward.lam or 1.0
    print("| caption | mean reward | identification (soft) | numbers masked (soft) | minus its reference |\n|---|---|---|---|---|")
    for p in captions:
        r, s, h = full[p], _mean(soft[p]), full.get(reference_of(p))
        m = _mean([None if v is None else v / lam for v in masked[p]]) if masked is not None else None
        gap = "" if r is None or h is None else f"{r - h:+.3f}"
        print(f"| {p} | {'unscored' if r is None else f'{r:.3f}'} | {'' if s is None else f'{s:.3f}'} | "
              f"{'' if m is None else f'{m:.3f}'} | {gap} |")
    won = winning_probes(full, margin)
    twins = "".join(f"; for {p}, {ref}" for p, ref in FALSE_CLAIM_PROBES.items())
    print(f"\nprobes within {margin:g} of their reference (honest{twins}) or above: {', '.join(won) or 'none'}")
    if cfg.ablate and cfg.probes:
        def report(title: str, steps: Sequence[tuple[str, dict[str, float | None]]]) -> None:
            print(f"\n{title}\n| switched off | honest | probes that would win (mean) |\n|---|---|---|")
            for term, means in steps:
                won, h = winning_probes(means, margin), means.get("honest")
                print(f"| {term} | {'' if h is None else f'{h:.3f}'} | "
                      + (", ".join(f"{p} ({means[p]:.3f})" for p in won) or "none") + " |")

        one = [(t, shaped_means(reward, dataclasses.replace(cfg.reward, **{t: 0.0}), captions, base, masked, rows))
               for t in switchable_terms(cfg.reward)]
        report("Each term alone switched off:", one)
        shaping = [t for t in switchable_terms(cfg.reward) if t != "lam"]  # the recipe's own term stays on
        kept, steps = minimal_terms(lambda off: shaped_means(reward, dataclasses.replace(cfg.reward, **dict.fromkeys(
            off, 0.0)), captions, base, masked, rows), shaping, margin)
        report("With the identification term on, shaping terms switched off one after another, each kept off "
               "while no probe wins:", steps)
        print(f"\nshaping terms no probe needs together: {', '.join(t for t in shaping if t not in kept) or 'none'}"
              f"; shaping terms a probe needs: {', '.join(kept) or 'none'}")
    return 0


def minimal_terms(means_without: Any, terms: Sequence[str], margin: float) -> tuple[list[str],
                                                                                   list[tuple[str, dict[str, Any]]]]:
    """Greedy: switch the terms off one after another (``means_without(off)`` gives each probe's mean with the
    terms ``off`` switched off), keeping each off while no probe wins; returns the terms that had to stay on
    (a probe wins without each, given the others off) and each step's means."""
    off: list[str] = []
    kept: list[str] = []
    steps = []
    for term in terms:
        means = means_without([*off, term])
        steps.append((term if not off else f"{term} (with {', '.join(off)})", means))
        (kept if winning_probes(means, margin) else off).append(term)
    return kept, steps
