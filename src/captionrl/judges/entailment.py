"""Entailment judge (LineupRL Table 1 "Entailment"): the fraction of reference captions a caption entails.

For every (generated caption, reference) pair the judge asks whether the generated caption (premise)
entails the reference (hypothesis) and reads P(entails) in one pass:

- ``yesno``: an LLM through any backend, ``backend.choose`` over the answer words ``Yes``/``No``;
- ``letters``: the same question as a two-option multiple choice ``A``/``B`` (for models that follow
  letter formats better than yes/no);
- ``nli``: a transformers sequence-classification NLI folder, P(label whose name contains "entail").

An item's score is the share of its references entailed (P > ``threshold``; ``soft`` averages P instead).
Both are recorded, with the method and every pair's probability. If any pair of an item could not be
scored, the item is unscored (``score=None``), never a silent 0: its denominator would be wrong.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from captionrl.backends.base import Backend, Message, model_failure
from captionrl.errors import ConfigError, DataError
from captionrl.judges.base import Columns, require_columns, unscored
from captionrl.types import Judgment

METHODS = ("yesno", "letters", "nli")

QUESTION = (
    "Premise (a description of a time series):\n{premise}\n\n"
    "Hypothesis:\n{hypothesis}\n\n"
    "If the premise is true, must the hypothesis also be true? "
)
YESNO_TAIL = "Answer with one word: Yes or No."
LETTERS_TAIL = "A) Yes, the premise entails the hypothesis.\nB) No, it does not.\nAnswer with the letter only."


def references_of(value: Any, where: str) -> list[str]:
    """A references cell as a list of non-empty strings (a single string counts as one reference)."""
    refs = [value] if isinstance(value, str) else list(value) if isinstance(value, (list, tuple)) else None
    if refs is None or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise DataError(where, value, "must be a non-empty list of reference captions (strings)",
                        'write "references": ["first reference", "second reference"]')
    return refs


class NLIModel:
    """A local transformers sequence-classification NLI folder; P(entailment) per (premise, hypothesis)."""

    def __init__(self, path: str | Path, batch_size: int = 16) -> None:
        p = Path(path).expanduser()
        if not (p / "config.json").exists():
            raise ConfigError("nli_model", str(path), "is not a local transformers model folder",
                              "give the folder of a saved sequence-classification NLI model (no downloads)")
        from transformers import AutoConfig

        cfg = AutoConfig.from_pretrained(p)
        labels = {int(k): str(v).lower() for k, v in (cfg.id2label or {}).items()}
        hits = [i for i, name in labels.items() if "entail" in name and "not" not in name]
        if len(hits) != 1:
            raise ConfigError("nli_model", str(path), f"no single 'entailment' label in id2label={cfg.id2label}",
                              "use an NLI model whose config names its labels (entailment/neutral/contradiction)")
        self.path, self.entail_index, self.batch_size = p, hits[0], batch_size
        self.name = f"nli:{p.name}"
        self._model: Any = None
        self._tok: Any = None

    def probs(self, pairs: Sequence[tuple[str, str]]) -> list[float]:
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        if self._model is None:
            self._tok = AutoTokenizer.from_pretrained(self.path)
            self._model = AutoModelForSequenceClassification.from_pretrained(self.path).eval()
        out: list[float] = []
        with torch.inference_mode():
            for s in range(0, len(pairs), self.batch_size):
                chunk = pairs[s : s + self.batch_size]
                enc = self._tok([a for a, _ in chunk], [b for _, b in chunk], padding=True, truncation=True,
                                max_length=512, return_tensors="pt")
                p = self._model(**enc).logits.float().softmax(-1)[:, self.entail_index]
                out.extend(float(x) for x in p)
        return out


class EntailmentJudge:
    """Judge protocol: ``judge(captions, {"references": [[...], ...]})`` -> share of references entailed."""

    def __init__(self, backend: Backend | None = None, *, method: str = "yesno", nli_model: str | None = None,
                 threshold: float = 0.5, soft: bool = False) -> None:
        if method not in METHODS:
            raise ConfigError("entail.method", method, "unknown method", f"use one of {list(METHODS)}")
        if method == "nli" and not nli_model:
            raise ConfigError("entail.nli_model", nli_model, "method 'nli' needs an NLI model folder",
                              "pass --nli PATH, or use --method yesno with an LLM backend")
        if method != "nli" and backend is None:
            raise ConfigError("entail.backend", None, f"method {method!r} needs an LLM backend",
                              "pass a backend (e.g. hf:embedded) or use --method nli --nli PATH")
        if not 0.0 < threshold < 1.0:
            raise ConfigError("entail.threshold", threshold, "must be in (0, 1)", "use 0.5")
        self.backend, self.method, self.threshold, self.soft = backend, method, threshold, soft
        self.nli = NLIModel(nli_model) if method == "nli" else None  # type: ignore[arg-type]
        model = self.nli.name if self.nli else getattr(backend, "name", "backend")
        self.name = f"entail[{method}:{model}]"

    def messages(self, premise: str, hypothesis: str) -> list[Message]:
        tail = LETTERS_TAIL if self.method == "letters" else YESNO_TAIL
        return [{"role": "user", "content": QUESTION.format(premise=premise, hypothesis=hypothesis) + tail}]

    def pair_probs(self, pairs: Sequence[tuple[str, str]]) -> list[tuple[float | None, str | None, str]]:
        """(P(entails), error, path) per (premise, hypothesis); path records how P was read."""
        if not pairs:
            return []
        if self.nli is not None:
            try:
                return [(p, None, "nli") for p in self.nli.probs(pairs)]
            except Exception as exc:  # out of memory leaves every pair unscored, visibly; bugs re-raise
                return [(None, str(model_failure(exc)), "nli")] * len(pairs)
        options = ["A", "B"] if self.method == "letters" else ["Yes", "No"]
        results = self.backend.choose([self.messages(a, b) for a, b in pairs], options)  # type: ignore[union-attr]
        out: list[tuple[float | None, str | None, str]] = []
        for r in results:
            if r.probs is None:
                out.append((None, r.error or "no option probabilities", r.method))
            else:
                out.append((float(r.probs[options[0]]), None, r.method))
        return out

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        require_columns(columns, ["references"], len(captions), self.name)
        refs = [references_of(v, f"references[{i}]") for i, v in enumerate(columns["references"])]
        pairs = [(c, r) for c, rs in zip(captions, refs, strict=True) for r in rs]
        probs = self.pair_probs(pairs)
        out: list[Judgment] = []
        k = 0
        for cap, rs in zip(captions, refs, strict=True):
            got = probs[k : k + len(rs)]
            k += len(rs)
            paths = sorted({m for _, _, m in got})
            p_list = [p for p, _, _ in got]
            errors = [e for _, e, _ in got if e]
            extra = {"p_entail": p_list, "n_references": len(rs), "path": ",".join(paths)}
            if errors or any(p is None for p in p_list) or not cap.strip():
                why = errors[0] if errors else "empty caption" if not cap.strip() else "missing probability"
                if not cap.strip() and not errors:  # an empty caption entails nothing: a real 0, not a failure
                    out.append(Judgment(score=0.0, decision=[False] * len(rs), method=self.method,
                                        reason="empty caption", extra={**extra, "hard": 0.0, "soft": 0.0}))
                    continue
                out.append(unscored(why, **extra, method=self.method))
                continue
            decided = [p > self.threshold for p in p_list]  # type: ignore[operator]
            hard = sum(decided) / len(rs)
            soft = sum(p_list) / len(rs)  # type: ignore[arg-type]
            out.append(Judgment(score=soft if self.soft else hard, decision=decided, raw=p_list,
                                method=self.method, reason=f"{sum(decided)}/{len(rs)} references entailed",
                                extra={**extra, "hard": hard, "soft": soft}))
        return out
