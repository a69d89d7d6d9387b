"""What the engine adapters share: the one reward, built once per process, labels and the failure policy.

Engines call a plain function per sample, so the reward is built once per process from the YAML file named
by ``CAPTIONRL_REWARD_CONFIG``: sections ``verifier`` (a BackendConfig), ``reward`` (``rewards.spec.RewardSpec``:
the ``reward`` section of ``train lineup`` and of the reward service, key for key) and ``series`` (how the
verifier prints series), i.e. a ``rewards.spec.RewardSetup``; without the file, the defaults (the embedded
model as a likelihood verifier, the identification reward with the training guard). The reward is the one
``rewards.reward.Reward`` object every face wraps, so it is shaped exactly as in training, the
numbers-masked pass included. For identification the transcription guard and the factuality term measure
against the true series, the first of the label's candidates.

A label is what the reward service accepts (``serve.labels``): for identification
``encode_label(candidates)`` = ``{"candidates": [[true series...], [distractor...], ...]}``, with
``"series_text"`` (the numbers as the prompt printed them) when they differ from the values. A malformed
label raises ``DataError`` naming ``labels[i].<column>``.

Neither engine masks a reward (OpenRLHF 0.11 and verl read as ``docs/engines.md`` cites), so the adapters
follow ``captionrl.serve.failure``, the policy the reward service and its client follow too: a verifier
outage is re-judged until ``CAPTIONRL_OUTAGE_DEADLINE_S`` (default 60 s), then raises ``VerifierOutage``
(verl's step fails; OpenRLHF leaves the reward ``None`` and its batch fails: the run stops naming the
cause); a caption the verifier answered for but could not score gets ``CAPTIONRL_UNSCORED_REWARD`` (a
finite value you choose for this engine, logged as ``unscored``), and without it raises
``UnscorableCaption``. Every value sent is finite: never NaN, never None, never a silent 0.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from captionrl.errors import ConfigError
from captionrl.rewards.reward import Reward
from captionrl.rewards.spec import RewardSetup
from captionrl.serve.failure import FailurePolicy, Settled, score_labels_sync

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


@lru_cache(maxsize=1)
def setup() -> RewardSetup:
    """The adapters' ``RewardSetup`` from ``CAPTIONRL_REWARD_CONFIG`` (read once per process), or the defaults."""
    from captionrl.config import from_dict, load_yaml

    path = os.environ.get(CONFIG_ENV)
    return from_dict(RewardSetup, load_yaml(path) if path else {})


@lru_cache(maxsize=1)
def reward() -> Reward:
    """The process-wide reward (built once: the verifier loads, CIDEr-D fits its corpus, here)."""
    from captionrl.serve.config import build_judge

    return build_judge(setup())


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


def scores(captions: Sequence[str], labels: Sequence[Any]) -> list[tuple[Settled, dict[str, float]]]:
    """Each caption's finite reward and its log fields (``unscored`` and the reward's fixed key set), scored
    by the one reward through the service's label scoring (``serve.labels.label_rows``,
    ``serve.failure.score_labels``); a malformed label raises ``DataError``."""
    from captionrl.serve.labels import label_rows

    cfg = setup()
    rows = label_rows(labels, cfg.reward.family, needs_main=cfg.needs_main_column())
    keys = sorted({k for r in rows for k in r})
    r = reward()
    got = score_labels_sync(
        lambda idx: r.score([captions[i] for i in idx], {k: [rows[i].get(k) for i in idx] for k in keys}),
        len(captions), failure_policy(), r.log_keys())
    return [(s, {k: v[i] for k, v in got.logs.items()}) for i, s in enumerate(got.settled)]
