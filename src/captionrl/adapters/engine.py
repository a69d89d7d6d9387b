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

Neither engine masks a reward (OpenRLHF 0.11 and verl read as ``docs/engines.md`` cites), so the
adapters follow ``captionrl.serve.failure``, the policy the reward service and its client follow too: a
verifier outage is re-judged until ``CAPTIONRL_OUTAGE_DEADLINE_S`` (default 60 s), then raises
``VerifierOutage`` (verl's step fails; OpenRLHF leaves the reward ``None`` and its batch fails: the run
stops naming the cause); a caption the verifier answered for but could not score gets
``CAPTIONRL_UNSCORED_REWARD`` (a finite value you choose for this engine, logged as ``unscored``), and
without it raises ``UnscorableCaption``. Never NaN, never a silent 0.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from captionrl.errors import ConfigError, DataError
from captionrl.judges.identification import IdentificationJudge, IdentifyConfig
from captionrl.rewards.shaping import Shaped, ShapedReward, ShapingConfig
from captionrl.serve.failure import FailurePolicy, judge_through_outages_sync, settle
from captionrl.types import Judgment

CONFIG_ENV = "CAPTIONRL_REWARD_CONFIG"
UNSCORED_ENV = "CAPTIONRL_UNSCORED_REWARD"
DEADLINE_ENV = "CAPTIONRL_OUTAGE_DEADLINE_S"
REMOVED_ENV = "CAPTIONRL_ON_FAILURE"


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


def failure_policy() -> FailurePolicy:
    """The adapters' ``serve.failure`` policy from the environment (read per call: a test or a launcher may
    set it late)."""
    if os.environ.get(REMOVED_ENV):
        raise ConfigError(REMOVED_ENV, os.environ[REMOVED_ENV], "was removed: NaN reaches OpenRLHF and verl as a "
                          "reward they do not mask", f"unset it; export {UNSCORED_ENV}=<a finite reward> for captions "
                          "the verifier cannot score (an outage is retried, then raises)")
    values: dict[str, float | None] = {}
    for env, default in ((UNSCORED_ENV, None), (DEADLINE_ENV, 60.0)):
        raw = os.environ.get(env)
        try:
            values[env] = default if raw in (None, "") else float(raw)  # type: ignore[arg-type]
        except ValueError as exc:
            raise ConfigError(env, raw, "is not a number", f"export {env}=<number>") from exc
    return FailurePolicy(unscored_reward=values[UNSCORED_ENV], outage_deadline_s=float(values[DEADLINE_ENV] or 0.0),
                         setting=UNSCORED_ENV)


def score_or_fail(judgment: Judgment) -> float:
    """The reward an engine receives for one judgment whose outages were already retried (``serve.failure``)."""
    return settle([judgment], failure_policy())[0].reward


def _judge(captions: Sequence[str], cands: list[Any]) -> list[Judgment]:
    """Identification judgments, an outage re-judged until the policy's deadline."""
    judge = identification_judge()
    return judge_through_outages_sync(
        lambda idx: judge.judge([captions[i] for i in idx], {"candidates": [cands[i] for i in idx]}),
        len(captions), failure_policy())


def shaped_scores(captions: Sequence[str], labels: Sequence[Any]) -> list[tuple[Judgment, Shaped]]:
    """Judge, then shape exactly as training does (guard and factuality against the true series)."""
    cands = [decode_label(lab) for lab in labels]
    judgments = _judge(captions, cands)
    texts = [_label(lab).get("series_text") for lab in labels]
    shaped = shaped_reward().shape(list(captions), [j.score if j.scored else None for j in judgments],
                                   series=[c[0] for c in cands], series_text=texts if any(texts) else None)
    return list(zip(judgments, shaped, strict=True))


def final_score(judgment: Judgment, shaped: Shaped) -> float:
    """The shaped reward, or what ``score_or_fail``'s policy gives a caption the judge could not score."""
    base = score_or_fail(judgment)
    return base if not judgment.scored or shaped.reward is None else float(shaped.reward)


def shaping_logs(shaped: Shaped) -> dict[str, float]:
    """Per-sample terms both engines log next to the score."""
    t = shaped.transcription
    return {"copied_values": float(t.copied if t else 0), "transcription_share": float(t.share if t else 0.0),
            "transcription_penalty": shaped.transcription_penalty,
            "red_share": float("nan") if shaped.red_share is None else shaped.red_share}
