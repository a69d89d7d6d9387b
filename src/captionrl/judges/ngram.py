"""CIDEr-D against reference captions: the n-gram reward baseline (RubiCap's "RL-NLP").

Implemented here (numpy-free pure Python, no pycocoevalcap) following Vedantam et al. 2015 and the
coco-caption code: for n = 1..4, TF-IDF vectors of a caption's n-grams, with document frequency counted
over the reference *sets* of a corpus (one set per image) and idf = log(|corpus|) - log(max(1, df));
the candidate's counts are clipped to the reference's (min(g_c, g_r) · g_r), the cosine is multiplied by
a Gaussian length penalty exp(-(l_c - l_r)^2 / (2 σ^2)) with σ = 6 (lengths counted in bigrams,
as coco-caption does), averaged over references and over n,
and scaled by 10. Tokens are lower-cased alphanumeric runs (punctuation dropped, as the PTB tokenizer does).

The corpus matters: the document frequencies are fitted once on the training references, as coco-caption
does for self-critical training (its ``coco-train-idxs``). Fitting them on the batch being scored, as this
judge once did, makes every idf log(1) - log(1) = 0 for a per-sample caller (OpenRLHF 0.11 and verl's
reward loop send one sample per request), so CIDEr-D was 0 for every caption. ``NgramJudge`` therefore
refuses to start without a corpus (``CorpusRequired``): the run's training rows (``train rubicap``), a
prepared folder's train split, or a reference file (``NgramConfig.references``, see ``load_reference_sets``).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError, DataError
from captionrl.judges.base import Columns, require_columns
from captionrl.types import Judgment


def tokenize(text: str) -> list[str]:
    return re.findall(r"[a-z0-9]+", text.lower())


def ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


@dataclass
class NgramConfig:
    """CIDEr-D settings (defaults are the standard ones)."""

    n: int = help_field(4, "largest n-gram order")
    sigma: float = help_field(6.0, "length-penalty width (CIDEr-D)")
    scale: float = help_field(10.0, "final multiplier (10 in CIDEr-D)")
    references: str | None = help_field(None, "the training references the document frequencies are fitted on, once: a prepared folder (captionrl data prepare; its train split's captions) or a file (.jsonl: one item per line, a list of captions or {\"references\": [...]}; .json: a list of those). Training without it fits on the run's own training rows; the reward service refuses CIDEr-D without it")

    def __post_init__(self) -> None:
        if self.n < 1:
            raise ConfigError("ngram.n", self.n, "must be >= 1", "set n: 4")
        if self.sigma <= 0:
            raise ConfigError("ngram.sigma", self.sigma, "must be > 0", "set sigma: 6")


class CiderD:
    """CIDEr-D scorer with document frequencies from a reference corpus."""

    def __init__(self, cfg: NgramConfig | None = None) -> None:
        self.cfg = cfg or NgramConfig()
        self.df: Counter[tuple[str, ...]] = Counter()
        self.n_docs = 0

    def fit(self, reference_sets: Iterable[Sequence[str]]) -> CiderD:
        """Count, for every n-gram, the number of reference sets (images) containing it."""
        self.df = Counter()
        self.n_docs = 0
        for refs in reference_sets:
            seen: set[tuple[str, ...]] = set()
            for r in refs:
                toks = tokenize(r)
                for n in range(1, self.cfg.n + 1):
                    seen.update(ngrams(toks, n))
            self.df.update(seen)
            self.n_docs += 1
        return self

    def _vec(self, text: str) -> tuple[list[dict[tuple[str, ...], float]], list[float], int]:
        toks = tokenize(text)
        log_n = math.log(float(max(self.n_docs, 1)))
        vecs, norms = [], []
        for n in range(1, self.cfg.n + 1):
            v = {g: tf * (log_n - math.log(max(1.0, float(self.df[g])))) for g, tf in ngrams(toks, n).items()}
            vecs.append(v)
            norms.append(math.sqrt(sum(x * x for x in v.values())))
        return vecs, norms, max(len(toks) - 1, 0)  # coco-caption measures length in bigrams

    def score(self, candidate: str, references: Sequence[str]) -> float:
        if not references:
            raise DataError("references", references, "no reference captions", "give at least one reference")
        vc, nc, lc = self._vec(candidate)
        total = 0.0
        for ref in references:
            vr, nr, lr = self._vec(ref)
            penalty = math.exp(-((lc - lr) ** 2) / (2 * self.cfg.sigma**2))
            per_n = 0.0
            for n in range(self.cfg.n):
                if nc[n] == 0 or nr[n] == 0:
                    continue
                dot = sum(min(w, vr[n][g]) * vr[n][g] for g, w in vc[n].items() if g in vr[n])
                per_n += dot / (nc[n] * nr[n])
            total += penalty * per_n / self.cfg.n
        return self.cfg.scale * total / len(references)


class CorpusRequired(ConfigError):
    """CIDEr-D was asked for without the training references its document frequencies need."""


def load_reference_sets(path: str | Path, field: str = "ngram.references") -> list[list[str]]:
    """Reference sets (one per training item) from a prepared folder (train split) or a reference file."""
    p = Path(path)
    if p.is_dir():
        from captionrl.domains.prepare.folder import load_prepared

        sets = [list(s.meta.get("captions", [])) for s in load_prepared(p, field=field).items["train"]]
    elif p.is_file():
        text = p.read_text(encoding="utf-8")
        try:
            rows: Any = json.loads(text) if p.suffix == ".json" else [json.loads(x) for x in text.splitlines() if x.strip()]
        except ValueError as exc:
            raise DataError(field, str(p), f"is not valid JSON{'' if p.suffix == '.json' else ' lines'} ({exc})",
                            'write one item per line: ["ref 1", "ref 2"] or {"references": [...]}') from exc
        if not isinstance(rows, list):
            raise DataError(field, str(p), "must hold a list of items", 'write [["ref 1", ...], ...]')
        sets = [_reference_set(r, f"{field}:{p.name}[{i}]") for i, r in enumerate(rows)]
    else:
        raise DataError(field, str(p), "does not exist", "give a prepared folder or a reference file (.json/.jsonl)")
    sets = [s for s in sets if s]
    if not sets:
        raise DataError(field, str(p), "has no reference captions in its training items",
                        "point it at the training references (a split with captions)")
    return sets


def _reference_set(row: Any, where: str) -> list[str]:
    refs = row.get("references", row.get("captions")) if isinstance(row, dict) else row
    if isinstance(refs, str):
        refs = [refs]
    if not isinstance(refs, list) or not all(isinstance(r, str) for r in refs):
        raise DataError(where, row, "must be a list of caption strings or {\"references\": [...]}",
                        'write ["ref 1", "ref 2"] or {"references": ["ref 1", ...]}')
    return refs


class NgramJudge:
    """CIDEr-D reward; column ``references`` (per row a list of captions) or ``reference`` (one caption).

    The document frequencies are fitted once, at construction, on ``corpus`` (reference sets) or on
    ``cfg.references``; with neither it raises ``CorpusRequired`` (never a per-batch fit)."""

    name = "ngram"

    def __init__(self, cfg: NgramConfig | None = None, corpus: Iterable[Sequence[str]] | None = None, *,
                 field_prefix: str = "ngram") -> None:
        self.scorer = CiderD(cfg)
        cfg = self.scorer.cfg
        if corpus is None and cfg.references:
            corpus = load_reference_sets(cfg.references, field=f"{field_prefix}.references")
        if corpus is None:
            raise CorpusRequired(
                f"{field_prefix}.references", None, "CIDEr-D needs document frequencies fitted on the training "
                "references (with one item per request every idf is log(1) - log(1) = 0)",
                f"set {field_prefix}.references to a prepared folder or a reference file (.jsonl, one item's "
                "captions per line)")
        self.scorer.fit(corpus)
        if self.scorer.n_docs < 2:
            raise CorpusRequired(f"{field_prefix}.references", self.scorer.n_docs, "fits on fewer than 2 items: "
                                 "every idf is 0", "give the references of all training items")

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        col = "references" if "references" in columns else "reference"
        require_columns(columns, [col], len(captions), self.name)
        refs = [[r] if isinstance(r, str) else [str(x) for x in r] for r in columns[col]]
        return [Judgment(score=self.scorer.score(c, r), method="cider-d",
                         extra={"corpus_docs": self.scorer.n_docs}) for c, r in zip(captions, refs, strict=True)]
