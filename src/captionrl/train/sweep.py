"""``captionrl train sweep``: the ablations of the reward's three knobs (LineupRL Tables 10-15, Figure 3).

It trains a LineupRL run per setting, so it lives in ``train/`` (``eval/`` sits below ``train/`` and may
not import it); ``captionrl eval sweep`` is an alias kept for existing scripts.

``lineup`` names the base ``train lineup`` YAML (the LineupRL recipe).

The knobs are the training verifier (``verifiers``), the number of candidates ``ks`` and the distractor
rule ``rules`` (nearest / random). As in the paper, one knob moves at a time from the base setting (the
first value of every list, or the base config's value when a list is empty): each setting is a
``captionrl train lineup`` run (``train.lineup.run`` with the sweep's overrides) whose held-out captions
then go through ``captionrl eval paper`` with the *same* evaluation settings (``eval:``, a mapping of
``PaperEvalConfig`` fields: evaluation verifiers, K, bottleneck...), the setting's training verifier
being the one kept out of the mean (``c2s[train]``).

Outputs in ``out``: ``settings/<name>/`` (the run, its captions and its paper evaluation, and
``setting.json`` once done: a setting whose ``setting.json`` exists is not rerun), one table per knob
(``table-<knob>/``: Ent., c2s, s2c, c2s[train], Len., the logged reward accuracy above chance; and
``bottleneck-<knob>/`` with Rel. to the base setting when the evaluation runs the bottleneck), and
``figure3-<knob>.png`` (s->c, or c->s, per setting; Rel. beside it when measured) plus
``figure3-reward.png`` (reward accuracy above chance per training verifier and K).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.eval.result import EvalResult, write_result
from captionrl.records import dumps, write_json


@dataclass
class SweepConfig:
    """Settings of ``captionrl train sweep``."""

    lineup: str | None = help_field(None, "base 'train lineup' YAML (the LineupRL recipe every setting starts from)")
    overrides: list[str] = help_field([], "key=value overrides of the base config applied to every setting (e.g. train.max_steps=200)")
    out: str = help_field("runs/sweep", "output folder (rerun to resume: finished settings are not rerun)")
    verifiers: list[str] = help_field([], "training verifier specs, [NAME=]SPEC (knob 1; the first is the base)")
    ks: list[int] = help_field([], "candidate counts K of the reward (knob 2; the first is the base)")
    rules: list[str] = help_field([], "distractor rules: nearest and/or random (knob 3; the first is the base)")
    eval: dict[str, Any] = help_field({}, "'captionrl eval paper' settings shared by every setting (verifiers, k, identify, entail, reward, bottleneck, reference ignored)")

    def __post_init__(self) -> None:
        for r in self.rules:
            if r not in ("nearest", "random"):
                raise ConfigError("rules", r, "unknown distractor rule", "use nearest and/or random")
        for k in self.ks:
            if int(k) < 2:
                raise ConfigError("ks", k, "K must be at least 2", "use e.g. ks=[4,6,8]")
        if not (self.verifiers or self.ks or self.rules):
            raise ConfigError("verifiers/ks/rules", [], "no knob to sweep", "give e.g. ks=[4,6,8] or rules=[nearest,random]")
        self.paper_config("check.jsonl", "check")  # a bad eval: section fails now, before any training
        self.lineup_config(self.base_setting(), Path(self.out))

    def base_setting(self) -> Setting:
        """The base setting (every knob at its first value)."""
        return next(iter(settings_of(self).values()))[0]

    def lineup_config(self, s: Setting, folder: Path) -> Any:
        """The setting's ``train lineup`` config: base YAML + overrides + the setting's knobs."""
        return _lineup_config(self, s, folder)

    def paper_config(self, captions: str | Sequence[str], out: str | Path, train_verifier: str | None = None) -> Any:
        """The shared ``eval paper`` config for one setting's caption files."""
        return _paper_config(self, captions, out, train_verifier)


CONFIG = SweepConfig


@dataclass(frozen=True)
class Setting:
    """One point of the sweep: the training verifier (name, spec or None = the base config's), K, rule."""

    verifier: tuple[str, str | None]
    k: int | None
    rule: str | None

    @property
    def name(self) -> str:
        parts = [f"verifier={self.verifier[0]}", f"k={self.k if self.k is not None else 'base'}",
                 f"rule={self.rule or 'base'}"]
        return re.sub(r"[^A-Za-z0-9_.=,-]", "_", ",".join(parts))

    def value(self, knob: str) -> str:
        return {"verifier": self.verifier[0], "k": str(self.k), "rule": str(self.rule)}[knob]


def _named(specs: Sequence[str]) -> list[tuple[str, str | None]]:
    from captionrl.eval.paper import verifier_spec

    out: list[tuple[str, str | None]] = []
    for text in specs:
        name, spec = verifier_spec(text)
        out.append((name or spec.split(",")[0].replace(":", "-"), spec))
    return out


def settings_of(cfg: SweepConfig) -> dict[str, list[Setting]]:
    """knob -> its settings (the base first): one knob moves at a time, the others stay at the base."""
    verifiers = _named(cfg.verifiers) or [("base", None)]
    ks: list[int | None] = [int(k) for k in cfg.ks] or [None]
    rules: list[str | None] = list(cfg.rules) or [None]
    base = Setting(verifiers[0], ks[0], rules[0])
    out = {"verifier": [replace(base, verifier=v) for v in verifiers], "k": [replace(base, k=k) for k in ks],
           "rule": [replace(base, rule=r) for r in rules]}
    return {knob: s for knob, s in out.items() if len(s) > 1} or {"rule": [base]}


def _lineup_config(cfg: SweepConfig, s: Setting, folder: Path) -> Any:
    from captionrl.backends import parse_backend_spec
    from captionrl.config import load_config
    from captionrl.train.lineup import LineupConfig

    extra = [f"train.out_dir={folder / 'run'}"]
    if s.k is not None:
        extra.append(f"reward.k={s.k}")
    if s.rule is not None:
        extra.append(f"data.distractors={s.rule}")
    lc = load_config(LineupConfig, cfg.lineup, [*cfg.overrides, *extra])
    if s.verifier[1] is not None:
        lc.verifier = parse_backend_spec(s.verifier[1])
    return lc


def _paper_config(cfg: SweepConfig, captions: str | Sequence[str], out: str | Path, train_verifier: str | None = None) -> Any:
    from captionrl.config import from_dict
    from captionrl.eval.paper import PaperEvalConfig

    data = {k: v for k, v in cfg.eval.items() if k not in ("captions", "out", "train_verifier", "reference")}
    caps = [captions] if isinstance(captions, str) else list(captions)
    return from_dict(PaperEvalConfig, {**data, "captions": caps, "out": str(out), "train_verifier": train_verifier},
                     prefix="eval.")


def spec_of(bc: Any) -> str:
    """A backend spec string for a ``BackendConfig`` (the training verifier of the paper evaluation)."""
    if bc.kind == "openai":
        return f"openai:{bc.base_url}#{bc.model}"
    return f"{bc.kind}:{bc.model}"


# ---------------------------------------------------------------------- one setting
def run_setting(cfg: SweepConfig, s: Setting, backends: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Train and evaluate one setting, or read its finished result (``setting.json``)."""
    from captionrl.eval.paper import run as paper_run
    from captionrl.eval.paper import run_reward_row
    from captionrl.train import lineup

    folder = Path(cfg.out) / "settings" / s.name
    done = folder / "setting.json"
    if done.is_file():
        return json.loads(done.read_text())
    lc = cfg.lineup_config(s, folder)
    train_spec = spec_of(lc.verifier)
    given = dict(backends or {})
    result = lineup.run(lc, verifier=given.get(s.verifier[1] or train_spec))
    ev = result.get("eval") or {}
    if not ev.get("captions"):
        raise ConfigError("overrides", cfg.overrides, f"run {folder / 'run'} wrote no held-out captions",
                          "keep eval.enabled: true and data.n_test > 0 in the base config")
    files = write_captions(lc, ev["captions"], folder)
    pcfg = cfg.paper_config([f"{n}={p}" for n, p in files.items()], folder / "paper", train_spec)
    results = paper_run(pcfg, backends=given)
    record = {"setting": asdict(s), "name": s.name, "k": lc.reward.k, "rule": lc.data.distractors,
              "verifier": s.verifier[0], "train_verifier": train_spec,
              "reward": run_reward_row(folder / "run"),
              "tables": {p: r.summary() for p, r in results.items()}}
    write_json(done, record)
    return record


def write_captions(lc: Any, captions: Mapping[str, Mapping[str, str]], folder: Path) -> dict[str, Path]:
    """The run's held-out captions as ``captionrl caption`` JSONL (series, next, domain), one file per system."""
    from captionrl.domains.lineup_data import build_lineup_data

    data = build_lineup_data(lc.data, lc.reward.k, lc.seed)
    files: dict[str, Path] = {}
    for system, caps in captions.items():
        path = folder / f"captions-{system}.jsonl"
        lines = []
        for iid, text in caps.items():
            it = data.pool[iid]
            rec = {"id": iid, "series": it.values.tolist(), "caption": text, "domain": it.domain}
            if "next" in it.meta:
                rec["next"] = list(it.meta["next"])
            lines.append(dumps(rec))
        path.write_text("".join(line + "\n" for line in lines))
        files[system] = path
    return files


# ---------------------------------------------------------------------- tables and figures
def _row(table: Mapping[str, Any] | None, system: str) -> dict[str, Any]:
    rows = [r for r in (table or {}).get("rows", []) if r.get("system") == system]
    return dict(rows[0]) if rows else {}


def caption_table(knob: str, records: Sequence[Mapping[str, Any]]) -> EvalResult:
    """Tables 10/12/14: Ent., c2s, s2c (mean over the evaluation verifiers), c2s[train], Len., reward."""
    rows = []
    for rec in records:
        t = rec["tables"]
        ident = _row(t.get("identification"), "trained")
        ent = _row(t.get("entailment"), "trained")
        row = {"system": f"{knob}={rec['setting_value']}" + (" (base)" if rec.get("base") else ""),
               "Ent.": ent.get("entailment"), "c2s": ident.get("c2s"), "s2c": ident.get("s2c"),
               "c2s[train]": ident.get("c2s[train]"), "Len.": ident.get("length_chars"),
               "reward_above_chance": rec["reward"]["reward_above_chance"]}
        rows.append({k: v for k, v in row.items() if v is not None})
    cols = [c for c in ("Ent.", "c2s", "s2c", "c2s[train]", "Len.", "reward_above_chance") if any(c in r for r in rows)]
    return EvalResult(f"sweep-{knob}", rows, cols,
                      better={"Ent.": "higher", "c2s": "higher", "s2c": "higher", "c2s[train]": None, "Len.": None,
                              "reward_above_chance": "higher"},
                      notes=[f"one {knob} setting per row, everything else at the base setting; c2s/s2c: mean over the "
                             "evaluation verifiers (the training verifier only in c2s[train]); reward_above_chance: "
                             "the training log's mean reward accuracy, (acc - 1/K) / (1 - 1/K)"])


def bottleneck_table(knob: str, records: Sequence[Mapping[str, Any]]) -> EvalResult | None:
    """Tables 11/13/15: test MSE per (task, corpus) of each setting's captions, Rel. to the base setting."""
    from captionrl.eval import stats

    rows = []
    for rec in records:
        r = _row(rec["tables"].get("bottleneck"), "trained")
        if not r:
            return None
        cols = [c for c in rec["tables"]["bottleneck"]["columns"] if not c.endswith("Rel.")]
        rows.append({"system": f"{knob}={rec['setting_value']}" + (" (base)" if rec.get("base") else ""),
                     **{c: r[c] for c in cols if c in r}})
    cols = [c for c in rows[0] if c != "system"]
    rel_cols = []
    for task in dict.fromkeys(c.split(":")[0] for c in cols):
        keys = [c for c in cols if c.startswith(task + ":")]
        rel = f"{task}:Rel."
        rel_cols.append(rel)
        for r in rows:
            if all(k in r for k in keys):
                r[rel] = stats.geometric_rel(r, rows[0], keys)
    return EvalResult(f"sweep-{knob}-bottleneck", rows, cols + rel_cols, better=dict.fromkeys(cols + rel_cols, "lower"),
                      notes=["test MSE of the caption-only predictor on each setting's held-out captions; Rel.: geometric "
                             "mean over corpora of the ratio to the base setting (> 1: the caption carries less)"])


def plot_knob(knob: str, table: EvalResult, bottleneck: EvalResult | None, path: Path) -> None:
    """Figure 3 (a)/(b): the identification bar (s->c, else c->s) per setting, and Rel. when measured."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    metric = "s2c" if any("s2c" in r for r in table.rows) else "c2s"
    panels = [(metric, table)] + ([(c, bottleneck) for c in bottleneck.columns if c.endswith("Rel.")] if bottleneck else [])
    fig, axes = plt.subplots(1, len(panels), figsize=(3.2 * len(panels), 3.0), squeeze=False)
    for ax, (col, res) in zip(axes[0], panels, strict=True):
        names = [r["system"] for r in res.rows]
        ax.bar(range(len(names)), [r.get(col, float("nan")) for r in res.rows], color="tab:blue")
        ax.set_xticks(range(len(names)), names, rotation=30, ha="right", fontsize=7)
        ax.set_title(col, fontsize=9)
    fig.suptitle(f"reward knob: {knob}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def plot_reward(records: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Figure 3 (c): reward accuracy above chance per training verifier (rows) and K (columns)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    verifiers = list(dict.fromkeys(r["verifier"] for r in records))
    ks = sorted({int(r["k"]) for r in records})
    grid = np.full((len(verifiers), len(ks)), np.nan)
    for r in records:
        grid[verifiers.index(r["verifier"]), ks.index(int(r["k"]))] = r["reward"]["reward_above_chance"]
    fig, ax = plt.subplots(figsize=(1.2 * len(ks) + 2, 0.6 * len(verifiers) + 1.5))
    ax.imshow(grid, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(len(ks)), [f"K={k}" for k in ks])
    ax.set_yticks(range(len(verifiers)), verifiers, fontsize=7)
    for i in range(len(verifiers)):
        for j in range(len(ks)):
            if not np.isnan(grid[i, j]):
                ax.text(j, i, f"{grid[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_title("reward accuracy above chance", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ---------------------------------------------------------------------- the command
def run(cfg: SweepConfig, *, backends: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every setting (finished ones are read back), then the per-knob tables and figures."""
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    plan = settings_of(cfg)
    done: dict[str, dict[str, Any]] = {}
    for settings in plan.values():
        for s in settings:
            if s.name not in done:
                done[s.name] = run_setting(cfg, s, backends)
    tables: dict[str, Any] = {}
    for knob, settings in plan.items():
        records = [{**done[s.name], "setting_value": s.value(knob), "base": i == 0} for i, s in enumerate(settings)]
        table = write_result(caption_table(knob, records), out / f"table-{knob}")
        bn = bottleneck_table(knob, records)
        if bn is not None:
            write_result(bn, out / f"bottleneck-{knob}")
        plot_knob(knob, table, bn, out / f"figure3-{knob}.png")
        tables[knob] = table
    plot_reward(list(done.values()), out / "figure3-reward.png")
    write_json(out / "sweep.json", {"settings": sorted(done), "knobs": {k: [s.name for s in v] for k, v in plan.items()}})
    return {"tables": tables, "settings": done}


def run_command(cfg: SweepConfig) -> int:
    from captionrl.eval.result import markdown

    result = run(cfg)
    for table in result["tables"].values():
        print(markdown(table))
    print(f"{len(result['settings'])} setting(s); tables and figure3-*.png in {cfg.out}")
    return 0
