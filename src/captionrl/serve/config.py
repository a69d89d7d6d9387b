"""The reward service's configuration: the reward's one section (``rewards.spec.RewardSetup``: verifier,
reward, series) plus how the service listens, pools requests and settles failures."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.rewards.spec import RewardSetup
from captionrl.serve.failure import FailurePolicy
from captionrl.serve.text import END_OF_TURN

MAIN_COLUMN = {"identification": "candidates", "rubric": "rubric", "judge": "reference",
               "answerability": "questions", "cider": "references"}
"""The column a bare (non-object) label fills, per reward family."""


@dataclass
class RewardServiceConfig(RewardSetup):
    """``captionrl serve reward``: one of the project's rewards behind an HTTP endpoint (OpenRLHF contract).
    The ``verifier``, ``reward`` and ``series`` sections are the engine adapters' YAML and ``train lineup``'s
    reward section, key for key: a caption is shaped here exactly as in training."""

    host: str = help_field("127.0.0.1", "interface to listen on (0.0.0.0 to accept other machines)")
    port: int = help_field(8000, "TCP port")
    batch_window_ms: float = help_field(20.0, "how long a request waits for others to share its judge call (ms); 0 = no pooling")
    max_batch: int = help_field(256, "most captions per judge call")
    max_concurrency: int = help_field(1, "judge calls running at once (raise it for an openai verifier with replicas)")
    max_pending: int = help_field(16384, "captions waiting or running before new requests get HTTP 503")
    unscored_reward: float | None = help_field(None, "reward of a caption the judge answered for but could not score (no grade in its reply): a finite value you choose for this engine (e.g. the reward's minimum), flagged unscored and counted; null = refuse such a request (HTTP 422). Neither OpenRLHF nor verl masks NaN, so there is no NaN option (docs/engines.md)")
    outage_deadline_s: float = help_field(60.0, "how long captions a verifier outage left unscored are re-judged before the request fails with HTTP 503 (the engine's client then retries; OpenRLHF 0.11 gives up on a request after 180 s)")
    outage_retry_s: float = help_field(1.0, "seconds between re-judgings during an outage")
    failure_value: str | None = help_field(None, "removed: see unscored_reward")
    strip_suffixes: list[str] = help_field(list(END_OF_TURN), "end-of-turn texts removed from the end of each caption: OpenRLHF 0.11 decodes prompt + response with skip_special_tokens=False, so a response arrives with its EOS token as text")
    records: str | None = help_field("runs/serve/requests.jsonl", "per-request records (JSONL); null = none")
    log_level: str = help_field("warning", "uvicorn log level")

    def __post_init__(self) -> None:
        if self.failure_value is not None:
            raise ConfigError("failure_value", self.failure_value, "was removed: NaN or null reach OpenRLHF and verl "
                              "as rewards they do not mask", "drop it; set unscored_reward: <a finite value> for "
                              "captions the judge cannot score (an outage is retried, then HTTP 503)")
        for name, ok in (("batch_window_ms", self.batch_window_ms >= 0), ("max_batch", self.max_batch >= 1),
                         ("max_concurrency", self.max_concurrency >= 1), ("max_pending", self.max_pending >= 1),
                         ("port", 0 <= self.port < 65536)):
            if not ok:
                raise ConfigError(name, getattr(self, name), "out of range", f"see captionrl serve reward --help for {name}")
        self.failure_policy()  # rejects a non-finite unscored_reward or a negative deadline, naming the field

    @property
    def family(self) -> str:
        return self.reward.family

    def failure_policy(self) -> FailurePolicy:
        """The ``serve.failure`` policy these settings choose (one policy for every path to an engine)."""
        return FailurePolicy(unscored_reward=self.unscored_reward, outage_deadline_s=self.outage_deadline_s,
                             retry_interval_s=self.outage_retry_s)


def build_judge(cfg: RewardSetup, backend: Any = None) -> Any:
    """The reward ``cfg`` describes (``rewards.reward.Reward``: a ``Judge``), its verifier built from
    ``cfg.verifier`` when ``backend`` is not given (cider needs none)."""
    from captionrl.rewards.reward import build_reward

    if backend is None and cfg.reward.family != "cider":
        from captionrl.backends import make_backend

        backend = make_backend(cfg.verifier)
    return build_reward(cfg.reward, backend, series=cfg.series, name=cfg.reward.family)
