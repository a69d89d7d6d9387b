"""CIDEr-D against reference captions: the n-gram reward baseline (RubiCap's "RL-NLP").

Implemented here (numpy-free pure Python, no pycocoevalcap) following Vedantam et al. 2015 and the
coco-caption code: for n = 1..4, TF-IDF vectors of a caption's n-grams, with document frequency counted
over the reference *sets* of a corpus (one set per image) and idf = log(|corpus|) - log(max(1, df));
the candidate's counts are clipped to the reference's (min(g_c, g_r) · g_r), the cosine is multiplied by
a Gaussian length penalty exp(-(l_c - l_r)^2 / (2 σ^2)) with σ = 6 (lengths counted in bigrams,
as coco-caption does), averaged over references and over n,
and scaled by 10. Tokens are lower-cased alphanumeric runs (punctuation dropped, as the PTB tokenizer does).

The corpus matters: fit the document frequencies once on the training references (``fit``). Without a
fit, the judge uses the distinct reference sets of the batch it is given (deduplicated, so a group of G
captions of one item counts that item once), which is unstable for small batches.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

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


class NgramJudge:
    """CIDEr-D reward; column ``references`` (per row a list of captions) or ``reference`` (one caption)."""

    name = "ngram"

    def __init__(self, cfg: NgramConfig | None = None, corpus: Iterable[Sequence[str]] | None = None) -> None:
        self.scorer = CiderD(cfg)
        self.fitted = corpus is not None
        if corpus is not None:
            self.scorer.fit(corpus)

    def judge(self, captions: Sequence[str], columns: Columns) -> list[Judgment]:
        col = "references" if "references" in columns else "reference"
        require_columns(columns, [col], len(captions), self.name)
        refs = [[r] if isinstance(r, str) else [str(x) for x in r] for r in columns[col]]
        scorer = self.scorer
        if not self.fitted:
            scorer = CiderD(self.scorer.cfg).fit(list(dict.fromkeys(tuple(r) for r in refs)))
        return [Judgment(score=scorer.score(c, r), method="cider-d",
                         extra={"corpus_docs": scorer.n_docs}) for c, r in zip(captions, refs, strict=True)]
