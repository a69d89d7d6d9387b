"""What the engine adapters share: the reward's configuration, label encoding and failure policy.

Engines call a plain function per sample, so the judge is built once per process from the YAML file named
by ``CAPTIONRL_REWARD_CONFIG`` (sections ``verifier``: a BackendConfig, ``identify``: an IdentifyConfig,
``shaping``: the ``reward.*`` shaping keys of ``train lineup``, i.e. ``rewards.shaping.ShapingConfig``), or from the defaults (the embedded model as a likelihood
verifier). The reward is shaped exactly as in training (``captionrl.rewards.shaping``): the transcription
guard is on by default (4 free copied values, 0.1 per further value, 1.0 for a run of 3 consecutive
values), measured against the true series (index 0 of the candidates); the factuality term when
``shaping.factuality_penalty`` > 0. The candidate set travels in the
sample's label / ground truth as JSON: ``{"candidates": [[true series...], [distractor...], ...]}``, with
``"series_text"`` (the numbers as the prompt printed them, e.g. normalised) when the prompt's numbers differ
from the series: the guard then counts copies of either, as training does.

Neither engine can skip a sample, so a verifier failure cannot become ``None`` there. It must not become
a silent 0 either: by default it raises (the run stops with the cause); ``CAPTIONRL_ON_FAILURE=nan``
returns NaN instead, for engines set up to mask non-finite rewards.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from captionrl.errors import BackendError, DataError
from captionrl.judges.identify import IdentificationJudge, IdentifyConfig
from captionrl.rewards.shaping import Shaped, ShapedReward, ShapingConfig
from captionrl.types import Judgment

CONFIG_ENV = "CAPTIONRL_REWARD_CONFIG"
FAILURE_ENV = "CAPTIONRL_ON_FAILURE"


def encode_label(candidates: Sequence[Sequence[float]], series_text: str | None = None) -> str:
    """The ground-truth string to store in an engine's dataset (index 0 is the true series; ``series_text``:
    the true series as the prompt printed it, when that differs from the values)."""
    data: dict[str, Any] = {"candidates": [[float(v) for v in c] for c in candidates]}
    if series_text is not None:
        data["series_text"] = series_text
    return json.dumps(data)


def _label(label: Any) -> dict[str, Any]:
    return json.loads(label) if isinstance(label, (str, bytes)) else label


def decode_label(label: Any) -> list[list[float]]:
    data = _label(label)
    if not isinstance(data, dict) or "candidates" not in data:
        raise DataError("ground_truth", str(label)[:80], "has no 'candidates'",
                        "store captionrl.adapters.engine.encode_label(candidates) as the sample's label")
    return data["candidates"]


@lru_cache(maxsize=1)
def identification_judge() -> IdentificationJudge:
    """The process-wide judge, built from ``CAPTIONRL_REWARD_CONFIG`` or the embedded defaults."""
    from captionrl.backends import BackendConfig, make_backend
    from captionrl.config import from_dict, load_yaml

    path = os.environ.get(CONFIG_ENV)
    data = load_yaml(path) if path else {}
    verifier = from_dict(BackendConfig, data.get("verifier", {}), prefix="verifier.")
    icfg = from_dict(IdentifyConfig, data.get("identify", {}), prefix="identify.")
    return IdentificationJudge(make_backend(verifier), icfg)


def shaping_config(data: dict[str, Any] | None = None) -> ShapingConfig:
    """The ``shaping`` section of the adapters' YAML as ``ShapingConfig`` (the keys and defaults of ``reward.*``
    in ``train lineup``; unknown keys fail with close matches; no numbers-masked pass: one call per sample)."""
    from captionrl.config import from_dict

    return from_dict(ShapingConfig, data or {}, prefix="shaping.").single_pass()


@lru_cache(maxsize=1)
def shaped_reward() -> ShapedReward:
    """The process-wide shaping wrapper (its base is unused: the adapters judge first, then shape)."""
    from captionrl.config import load_yaml

    path = os.environ.get(CONFIG_ENV)
    data = load_yaml(path) if path else {}
    return ShapedReward(lambda *a, **k: [], shaping_config(data.get("shaping")), name="lineup")


def score_or_fail(judgment: Judgment) -> float:
    if judgment.scored:
        return float(judgment.score)  # type: ignore[arg-type]
    if os.environ.get(FAILURE_ENV, "raise") == "nan":
        return math.nan
    raise BackendError(
        f"the identification verifier could not score this caption ({judgment.error}); refusing to return "
        f"a 0 reward. Fix the verifier, or set {FAILURE_ENV}=nan if your engine masks non-finite rewards."
    )


def shaped_scores(captions: Sequence[str], labels: Sequence[Any]) -> list[tuple[Judgment, Shaped]]:
    """Judge, then shape exactly as training does (guard and factuality against the true series)."""
    cands = [decode_label(lab) for lab in labels]
    judgments = identification_judge().judge(list(captions), {"candidates": cands})
    texts = [_label(lab).get("series_text") for lab in labels]
    shaped = shaped_reward().shape(list(captions), [j.score if j.scored else None for j in judgments],
                                   series=[c[0] for c in cands], series_text=texts if any(texts) else None)
    return list(zip(judgments, shaped, strict=True))


def final_score(judgment: Judgment, shaped: Shaped) -> float:
    """The shaped reward, or the failure policy of ``score_or_fail`` when the judge could not score."""
    base = score_or_fail(judgment)
    return base if shaped.reward is None or math.isnan(base) else float(shaped.reward)


def shaping_logs(shaped: Shaped) -> dict[str, float]:
    """Per-sample terms both engines log next to the score."""
    t = shaped.transcription
    return {"copied_values": float(t.copied if t else 0), "transcription_share": float(t.share if t else 0.0),
            "transcription_penalty": shaped.transcription_penalty,
            "red_share": float("nan") if shaped.red_share is None else shaped.red_share}
