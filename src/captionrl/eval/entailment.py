"""``captionrl eval entail``: the fraction of reference captions each captioner's captions entail.

Input: one JSONL file per captioner, lines ``{id, caption, references?}`` (system named after the file
stem or ``NAME=PATH``), and optionally ``--references FILE`` with lines ``{id, references: [...]}`` for
files that carry no references. Items are matched by id; only ids every system captioned are scored.
The judge is ``captionrl.judges.entailment.EntailmentJudge`` (an LLM through any backend, or a local NLI
model). ``--demo`` builds a self-check from the embedded corpus: the references are the sentences of the
describer's caption, and the two systems are the describer itself (should entail nearly all) and the
describer's caption of *another* window (should entail few); a judge that cannot separate them cannot
be trusted on real captioners. Outputs in ``out``: ``records.jsonl`` (one line per system and item,
resumable), ``table.md``, ``summary.json``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.eval.common import backend_from_spec, check_spec, split_spec
from captionrl.eval.result import EvalResult, result_text, write_result
from captionrl.judges.entailment import EntailmentJudge, references_of
from captionrl.records import RecordWriter, check_caption, read_jsonl

PROTOCOL = "entailment"
Systems = dict[str, dict[str, str]]


@dataclass
class EntailEvalConfig:
    """Settings of ``captionrl eval entail`` (saved into summary.json)."""

    captions: list[str] = help_field([], "JSONL {id, caption, references?} per captioner ([NAME=]FILE)")
    references: str | None = help_field(None, "JSONL {id, references: [...]} (if the caption files lack them)")
    demo: bool = help_field(False, "self-check on the embedded corpus (no files needed)")
    out: str = help_field("runs/eval-entail", "output folder (rerun with the same folder to resume)")
    backend: str = help_field("hf:embedded", "judge LLM spec: hf:embedded, hf:PATH, openai:URL#MODEL, vllm:MODEL (+ ,key=value)")
    method: str = help_field("yesno", "yesno, letters or nli (a local NLI model)")
    nli: str | None = help_field(None, "local NLI sequence-classification folder (with method nli)")
    threshold: float = help_field(0.5, "P(entails) above which a reference counts")
    soft: bool = help_field(False, "score = mean P(entails) instead of the share")
    batch: int = help_field(8, "captions per judge call")
    quiet: bool = help_field(False, "no progress bars")

    def __post_init__(self) -> None:
        if self.method not in ("yesno", "letters", "nli"):
            raise ConfigError("method", self.method, "unknown method", "use yesno, letters or nli")
        if self.batch < 1:
            raise ConfigError("batch", self.batch, "must be at least 1", "set batch=8")
        if self.method != "nli":
            check_spec("backend", self.backend)


CONFIG = EntailEvalConfig


def load_inputs(specs: Sequence[str], references: str | None) -> tuple[Systems, dict[str, list[str]]]:
    """Caption files (and an optional references file) -> (system -> id -> caption, id -> references)."""
    systems: Systems = {}
    refs: dict[str, list[str]] = {}
    if references:
        rp = Path(references)
        if not rp.exists():
            raise DataError("--references", references, "file not found", "give a JSONL file of {id, references}")
        for n, rec in enumerate(read_jsonl(rp, unique_key="id"), 1):
            if "id" not in rec or "references" not in rec:
                raise DataError(f"{rp.name}:{n}", sorted(rec), "needs 'id' and 'references'",
                                'write {"id": "x", "references": ["..."]}')
            refs[str(rec["id"])] = references_of(rec["references"], f"{rp.name}:{n}.references")
    for spec in specs:
        name, path = split_spec(spec)
        p = Path(path)
        if not p.exists():
            raise DataError("--captions", spec, "file not found", "give JSONL files of {id, caption, references?}")
        if name in systems:
            raise ConfigError("--captions", spec, f"system name {name!r} repeats", "use NAME=PATH to name files")
        caps: dict[str, str] = {}
        for n, rec in enumerate(read_jsonl(p, unique_key="id"), 1):
            if "id" not in rec or "caption" not in rec:
                raise DataError(f"{p.name}:{n}", sorted(rec), "needs 'id' and a string 'caption'",
                                'write {"id": "x", "caption": "...", "references": ["..."]}')
            check_caption(rec["caption"], f"{p.name}:{n}.caption", "A red circle.")
            if str(rec["id"]) in caps:
                raise DataError(f"{p.name}:{n}.id", str(rec["id"]), "repeats an earlier line's id (which caption counts?)",
                                "give every item one caption per file")
            caps[str(rec["id"])] = rec["caption"]
            if rec.get("references") is not None:
                refs.setdefault(str(rec["id"]), references_of(rec["references"], f"{p.name}:{n}.references"))
        if not caps:
            raise DataError("--captions", str(p), "is empty (no caption lines)", "give a JSONL file of {id, caption} lines")
        systems[name] = caps
    return systems, refs


def demo_inputs(n_items: int = 12, seed: int = 0) -> tuple[Systems, dict[str, list[str]]]:
    """Self-check systems from the embedded corpus (see module doc); the other-window pairing is seeded."""
    from captionrl.domains.describe import describer_demo

    _windows, caps, other = describer_demo(n_items, seed)
    refs = {i: [s for s in re.split(r"(?<=\.)\s+", c) if s] for i, c in caps.items()}
    return {"describer": caps, "other window": other}, refs


def inputs_for(cfg: EntailEvalConfig) -> tuple[Systems, dict[str, list[str]]]:
    """The configured systems and references: the demo self-check, or the caption files."""
    if cfg.demo:
        return demo_inputs()
    if cfg.captions:
        return load_inputs(cfg.captions, cfg.references)
    raise ConfigError("captions", None, "no captions given", "pass --captions FILE... or --demo")


def run(cfg: EntailEvalConfig, *, judge: EntailmentJudge | None = None,
        inputs: tuple[Systems, Mapping[str, Sequence[str]]] | None = None) -> EvalResult:
    """Judge every (system, item) not yet in ``out/records.jsonl``; write table and summary.

    ``judge`` and ``inputs`` (systems, references) replace the configured ones.
    """
    from tqdm.auto import tqdm

    systems, refs = inputs if inputs is not None else inputs_for(cfg)
    if judge is None:
        backend = backend_from_spec(cfg.backend) if cfg.method != "nli" else None
        judge = EntailmentJudge(backend, method=cfg.method, nli_model=cfg.nli, threshold=cfg.threshold, soft=cfg.soft)
    out = Path(cfg.out)
    ids = sorted(set.intersection(*(set(c) for c in systems.values())) & set(refs))
    if not ids:
        raise DataError("items", sorted(systems), "no item has a caption from every system and references",
                        "give references for the captioned ids (in the caption files or --references)")
    t0 = time.perf_counter()
    with RecordWriter(out / "records.jsonl") as w:
        todo = [(s, i) for s in systems for i in ids if not w.has(f"{s}|{i}|{judge.name}")]
        bar = tqdm(total=len(systems) * len(ids), initial=len(systems) * len(ids) - len(todo), desc="entail",
                   disable=cfg.quiet)
        for start in range(0, len(todo), cfg.batch):
            chunk = todo[start : start + cfg.batch]
            caps = [systems[s][i] for s, i in chunk]
            for (s, i), j in zip(chunk, judge.judge(caps, {"references": [list(refs[i]) for _, i in chunk]}),
                                 strict=True):
                w.write({"key": f"{s}|{i}|{judge.name}", "system": s, "id": i, "judge": judge.name,
                         "caption": systems[s][i], "references": list(refs[i]), **j.to_record()})
            bar.update(len(chunk))
        bar.close()
        records = [r for r in w.records() if r.get("judge") == judge.name]
    rows = []
    for s in systems:
        mine = [r for r in records if r["system"] == s and r["id"] in set(ids)]
        scored = [r for r in mine if r["score"] is not None]
        rows.append({
            "system": s,
            "entailment": float(np.mean([r["hard"] for r in scored])) if scored else None,
            "entailment_soft": float(np.mean([r["soft"] for r in scored])) if scored else None,
            "length_chars": float(np.mean([len(systems[s][i]) for i in ids])),
            "n_scored": len(scored), "n_unscored": len(mine) - len(scored),
        })
    columns = ["entailment", "entailment_soft", "length_chars", "n_scored", "n_unscored"]
    result = EvalResult(
        PROTOCOL, rows, columns,
        better={"entailment": "higher", "entailment_soft": "higher", "length_chars": None, "n_scored": None,
                "n_unscored": "lower"},
        config={**asdict(cfg), "judge": judge.name, "judge_method": judge.method},
        records=str(out / "records.jsonl"),
        notes=[f"entailment: share of reference captions entailed ({judge.name})"],
        extra={"meta": {"n_items": len(ids), "wall_s": round(time.perf_counter() - t0, 1)}},
    )
    return write_result(result, out)


def run_command(cfg: EntailEvalConfig) -> int:
    print(result_text(run(cfg), cfg.out))
    return 0
