"""What the engine adapters share: the reward's configuration, label encoding and failure policy.

Engines call a plain function per sample, so the judge is built once per process from the YAML file named
by ``CAPTIONRL_REWARD_CONFIG`` (sections ``verifier``: a BackendConfig, ``identify``: an IdentifyConfig),
or from the defaults (the embedded model as a likelihood verifier). The candidate set travels in the
sample's label / ground truth as JSON: ``{"candidates": [[true series...], [distractor...], ...]}``.

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
from captionrl.types import Judgment

CONFIG_ENV = "CAPTIONRL_REWARD_CONFIG"
FAILURE_ENV = "CAPTIONRL_ON_FAILURE"


def encode_label(candidates: Sequence[Sequence[float]]) -> str:
    """The ground-truth string to store in an engine's dataset (index 0 is the true series)."""
    return json.dumps({"candidates": [[float(v) for v in c] for c in candidates]})


def decode_label(label: Any) -> list[list[float]]:
    data = json.loads(label) if isinstance(label, (str, bytes)) else label
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


def score_or_fail(judgment: Judgment) -> float:
    if judgment.scored:
        return float(judgment.score)  # type: ignore[arg-type]
    if os.environ.get(FAILURE_ENV, "raise") == "nan":
        return math.nan
    raise BackendError(
        f"the identification verifier could not score this caption ({judgment.error}); refusing to return "
        f"a 0 reward. Fix the verifier, or set {FAILURE_ENV}=nan if your engine masks non-finite rewards."
    )


def judge_captions(captions: Sequence[str], labels: Sequence[Any]) -> list[Judgment]:
    return identification_judge().judge(list(captions), {"candidates": [decode_label(lab) for lab in labels]})
