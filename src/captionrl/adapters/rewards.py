"""The adapters' other rewards (rubric, scalar, answerability, CIDEr-D): the reward service's judges and label
checks, called in-process by verl's ``compute_score`` and OpenRLHF's ``reward_func``.

The adapters' YAML (``CAPTIONRL_REWARD_CONFIG``) picks one with ``reward:`` (default ``identification``,
which keeps its shaped path in ``adapters.engine``), its verifier with ``verifier:`` (a BackendConfig) and
the judge's section as the service names it (``rubric``, ``scalar``, ``qa``, ``ngram``). A label is what
the service accepts (``captionrl.serve.labels``). CIDEr-D needs ``ngram.references`` (the training
references: a prepared folder or a reference file) and refuses to start without it (``CorpusRequired``).
Failures follow ``captionrl.serve.failure`` exactly as the identification path does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

from captionrl.serve.config import RewardServiceConfig
from captionrl.serve.failure import Settled, finite_logs, judge_through_outages_sync, settle
from captionrl.serve.labels import LOG_KEYS, check_row, label_columns

SECTIONS = ("rubric", "scalar", "qa", "ngram")


@lru_cache(maxsize=1)
def reward_config() -> RewardServiceConfig | None:
    """The non-identification reward the adapters' YAML names, or None (the identification path)."""
    from captionrl.adapters.engine import CONFIG_ENV
    from captionrl.config import from_dict, load_yaml

    path = os.environ.get(CONFIG_ENV)
    data = load_yaml(path) if path else {}
    if data.get("reward", "identification") == "identification":
        return None
    fields = {"reward": data["reward"], "backend": data.get("verifier", {}), "records": None,
              **{k: data[k] for k in SECTIONS if k in data}}
    return from_dict(RewardServiceConfig, fields)


@lru_cache(maxsize=1)
def reward_judge() -> Any:
    """The process-wide judge of ``reward_config()`` (built once: CIDEr-D fits its corpus here, once)."""
    from captionrl.serve.config import build_judge

    cfg = reward_config()
    assert cfg is not None, "reward_judge() is for the non-identification rewards"
    return build_judge(cfg)


def scores(captions: Sequence[str], labels: Sequence[Any]) -> list[tuple[Settled, dict[str, float]]]:
    """Each caption's finite reward and its log fields (one fixed key set), under ``serve.failure``."""
    from captionrl.adapters.engine import failure_policy

    cfg = reward_config()
    assert cfg is not None
    rows = [label_columns(lab, cfg.reward, i) for i, lab in enumerate(labels)]
    for i, row in enumerate(rows):
        check_row(row, cfg.reward, i, needs_main=cfg.reward != "scalar" or cfg.scalar.use_reference)
    judge, policy = reward_judge(), failure_policy()
    judgments = judge_through_outages_sync(
        lambda idx: judge.judge([captions[i] for i in idx], {k: [rows[i][k] for i in idx] for k in rows[0]}),
        len(captions), policy)
    settled = settle(judgments, policy)
    logs = finite_logs(judgments, settled, LOG_KEYS[cfg.reward])
    return [(s, {k: v[i] for k, v in logs.items()}) for i, s in enumerate(settled)]
