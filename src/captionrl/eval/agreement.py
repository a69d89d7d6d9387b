"""Judge-human agreement (MoCo Rubric §B.2): exact agreement and Cohen's kappa of each judge.

Inputs: human labels ``--labels FILE`` (JSONL ``{id, label}``, label A, B or tie) and one file per judge
``--judges NAME=FILE`` (JSONL ``{id, decision}``, decision A, B, tie, or null for an invalid reply).
Exact agreement is the share of *valid* judge decisions that match the label (the paper excludes invalid
responses); Cohen's kappa, kappa = (p_o - p_e) / (1 - p_e) with p_e the chance agreement from the two
label distributions, is computed on the same valid items. Invalid decisions are counted.

Without label files the run builds a check whose labels are known by construction: each offline item's
reference caption against another item's reference, sides swapped by a seeded coin; the embedded
pairwise judge is scored against those labels next to an always-"A" judge (kappa 0 by definition).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.common import backend_from_spec, check_spec
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.records import RecordWriter, read_jsonl

PROTOCOL = "agreement"


def normalise_label(x: Any) -> str | None:
    """"A"/"b"/"Tie"/"C"/"draw" -> "A"/"B"/"tie"; ``None``/"" -> ``None`` (invalid); anything else raises."""
    if x is None or (isinstance(x, str) and not x.strip()):
        return None
    t = str(x).strip().lower()
    if t in ("a", "b"):
        return t.upper()
    if t in ("tie", "c", "draw", "equal"):
        return "tie"
    raise DataError("label", x, "is not A, B or tie", "write A, B or tie (null for an invalid judge reply)")


def cohen_kappa(a: Sequence[str], b: Sequence[str]) -> float:
    """Cohen's kappa of two aligned label sequences (nan when undefined: no items, or p_e = 1 with p_o = 1)."""
    if len(a) != len(b):
        raise DataError("labels", (len(a), len(b)), "sequences differ in length", "align the two label lists")
    n = len(a)
    if n == 0:
        return float("nan")
    p_o = sum(x == y for x, y in zip(a, b, strict=True)) / n
    ca, cb = Counter(a), Counter(b)
    p_e = sum(ca[k] * cb[k] for k in set(ca) | set(cb)) / (n * n)
    if p_e == 1.0:
        return float("nan") if p_o == 1.0 else 0.0
    return (p_o - p_e) / (1 - p_e)


def agreement(human: Sequence[Any], judge: Sequence[Any]) -> dict[str, Any]:
    """Exact agreement and kappa on the items where the judge's decision is valid."""
    if len(human) != len(judge):
        raise DataError("judge", len(judge), f"{len(human)} human labels", "give one decision per labelled pair")
    pairs = []
    for h, j in zip(human, judge, strict=True):
        hl = normalise_label(h)
        if hl is None:
            raise DataError("label", h, "a human label is missing", "label every pair A, B or tie")
        jl = normalise_label(j)
        if jl is not None:
            pairs.append((hl, jl))
    hs, js = [p[0] for p in pairs], [p[1] for p in pairs]
    n_valid = len(pairs)
    return {
        "n": len(human), "valid": n_valid, "invalid": len(human) - n_valid,
        "exact": sum(x == y for x, y in pairs) / n_valid if n_valid else float("nan"),
        "kappa": cohen_kappa(hs, js),
    }


def load_labels(path: str | Path, field: str) -> dict[str, Any]:
    p = Path(path)
    if not p.exists():
        raise DataError("file", str(path), "not found", f"give a JSONL file with {{id, {field}}} lines")
    out = {}
    for n, rec in enumerate(read_jsonl(p, unique_key="id")):
        if "id" not in rec or field not in rec:
            raise DataError(f"{p.name}:line {n + 1}", sorted(rec), f"needs 'id' and '{field}'",
                            f'write lines like {{"id": "pair1", "{field}": "A"}}')
        if str(rec["id"]) in out:
            raise DataError(f"{p.name}:line {n + 1}.id", str(rec["id"]), "repeats an earlier line's id (which one counts?)",
                            f"give every pair one {field}")
        out[str(rec["id"])] = rec[field]
    if not out:
        raise DataError("file", str(p), "is empty (no lines)", f"give a JSONL file with {{id, {field}}} lines")
    return out


@dataclass
class AgreementEvalConfig:
    """The agreement protocol's settings (saved into summary.json)."""

    labels: str | None = help_field(None, "human labels JSONL {id, label}; empty: constructed labels on offline data")
    judges: list[str] = help_field([], "judge decisions NAME=FILE (JSONL {id, decision})")
    out: str = help_field("runs/eval-agreement", "output folder")
    demo_items: int = help_field(16, "offline items for the constructed-label check")
    seed: int = help_field(0, "seed of the constructed pairs' sides")
    judge: str = help_field("hf:embedded", "pairwise judge backend spec for the constructed check (hf:embedded, openai:URL#MODEL, ...)")

    def __post_init__(self) -> None:
        check_spec("judge", self.judge)


CONFIG = AgreementEvalConfig


def run(cfg: AgreementEvalConfig, *, judge: Any = None) -> EvalResult:
    """Agreement of every judge with the labels; ``judge`` replaces the constructed check's pairwise judge."""
    out = Path(cfg.out)
    if cfg.labels:
        if not cfg.judges:
            raise ConfigError("judges", [], "no judge decisions given", "pass judge decisions: --judges NAME=FILE ...")
        human = load_labels(cfg.labels, "label")
        decisions = {}
        for spec in cfg.judges:
            if "=" not in spec:
                raise ConfigError("judges", spec, "is not NAME=FILE", "write e.g. gemini=gemini.jsonl")
            name, path = spec.split("=", 1)
            decisions[name] = load_labels(path, "decision")
        note = "labels: human"
    else:
        human, decisions = constructed_check(cfg, judge)
        note = "labels constructed (reference caption vs another item's caption; seeded sides), not human"
    ids = list(human)
    rows = []
    with RecordWriter(out / "records.jsonl") as writer:
        for name, dec in decisions.items():
            missing = [i for i in ids if i not in dec]
            if missing:
                raise DataError(f"judges.{name}", missing[:5], f"{len(missing)} labelled pairs have no decision",
                                "judge every labelled pair (null marks an invalid reply)")
            for i in ids:
                writer.write({"key": f"{name}|{i}", "judge": name, "id": i, "label": human[i], "decision": dec[i]})
            rows.append({"system": name, **agreement([human[i] for i in ids], [dec[i] for i in ids])})
    columns = ["exact", "kappa", "valid", "invalid", "n"]
    result = EvalResult(PROTOCOL, rows, columns, better={"exact": "higher", "kappa": "higher", "valid": None,
                                                         "invalid": "lower", "n": None},
                        config=asdict(cfg), records=str(out / "records.jsonl"),
                        notes=[note, "exact agreement over valid decisions only"])
    return write_result(result, out)


def constructed_check(cfg: AgreementEvalConfig, judge: Any = None) -> tuple[dict[str, str], dict[str, dict[str, Any]]]:
    """Labels known by construction and the decisions of the pairwise judge and an always-A judge."""
    from captionrl.eval.common import offline_items
    from captionrl.judges.pairwise import PairwiseJudge
    from captionrl.probes import other_text

    items = offline_items(cfg.demo_items, seed=cfg.seed)
    rng = random.Random(f"agreement|{cfg.seed}")
    a, b, ev, labels = [], [], [], {}
    refs = [it["reference"] for it in items]
    for k, it in enumerate(items):
        good, bad = refs[k], other_text(refs, k)
        swap = rng.random() < 0.5
        a.append(bad if swap else good)
        b.append(good if swap else bad)
        ev.append(it["reference"])
        labels[str(it["id"])] = "B" if swap else "A"
    judge = judge or PairwiseJudge(backend_from_spec(cfg.judge))
    verdicts = judge.decide(a, b, ev)
    pairwise = {str(it["id"]): v.winner for it, v in zip(items, verdicts, strict=True)}
    return labels, {"pairwise": pairwise, "always_A": dict.fromkeys(labels, "A")}


def run_command(cfg: AgreementEvalConfig) -> int:
    print(result_text(run(cfg), cfg.out))
    return 0
