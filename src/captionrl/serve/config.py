"""The reward service's configuration and the judge it builds from it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from captionrl.backends import BackendConfig
from captionrl.config import help_field
from captionrl.errors import ConfigError
from captionrl.judges.identification import IdentifyConfig
from captionrl.judges.ngram import NgramConfig
from captionrl.judges.qa import QAConfig
from captionrl.judges.scalar import ScalarConfig
from captionrl.rewards.shaping import ShapingConfig
from captionrl.serve.failure import FailurePolicy
from captionrl.serve.text import END_OF_TURN

REWARDS = ("identification", "rubric", "scalar", "answerability", "cider")
MAIN_COLUMN = {"identification": "candidates", "rubric": "rubric", "scalar": "reference",
               "answerability": "questions", "cider": "references"}
"""The column a bare (non-object) label fills, per reward."""


@dataclass
class RubricServeConfig:
    """The rubric judge's reading of the verifier."""

    mode: str = help_field("choose", "choose (yes/no probability from the logits), generate (parse yes/no) or likelihood (PMI of the criterion after the caption)")
    decision: str = help_field("hard", "hard (a criterion counts when satisfied) or soft (weighted by the probability)")
    threshold: float | None = help_field(None, "decision threshold; null = the mode's default")
    store: str | None = help_field(None, "rubric store JSONL for labels that give an item_id instead of a rubric")


@dataclass
class RewardServiceConfig:
    """``captionrl serve reward``: one of the project's rewards behind an HTTP endpoint (OpenRLHF contract)."""

    reward: str = help_field("identification", "which reward: identification, rubric, scalar, answerability or cider")
    host: str = help_field("127.0.0.1", "interface to listen on (0.0.0.0 to accept other machines)")
    port: int = help_field(8000, "TCP port")
    backend: BackendConfig = field(default_factory=BackendConfig)
    identify: IdentifyConfig = field(default_factory=IdentifyConfig)
    shaping: ShapingConfig = field(default_factory=ShapingConfig, metadata={"help": "identification only: the training reward's shaping (the reward.* shaping keys of train lineup: max_copied_values, transcription_penalty, transcription_run, run_penalty, factuality_penalty, ...); missing keys take the same defaults, so the transcription guard is on unless switched off here"})
    rubric: RubricServeConfig = field(default_factory=RubricServeConfig)
    scalar: ScalarConfig = field(default_factory=ScalarConfig)
    qa: QAConfig = field(default_factory=QAConfig)
    ngram: NgramConfig = field(default_factory=NgramConfig)
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
        self.shaping.single_pass()
        if self.reward not in REWARDS:
            from captionrl.registry import suggest

            raise ConfigError("reward", self.reward, "unknown reward", suggest(self.reward, list(REWARDS)))
        if self.failure_value is not None:
            raise ConfigError("failure_value", self.failure_value, "was removed: NaN or null reach OpenRLHF and verl "
                              "as rewards they do not mask", "drop it; set unscored_reward: <a finite value> for "
                              "captions the judge cannot score (an outage is retried, then HTTP 503)")
        self.failure_policy()  # rejects a non-finite unscored_reward or a negative deadline, naming the field

    def failure_policy(self) -> FailurePolicy:
        """The ``serve.failure`` policy these settings choose (one policy for every path to an engine)."""
        return FailurePolicy(unscored_reward=self.unscored_reward, outage_deadline_s=self.outage_deadline_s,
                             retry_interval_s=self.outage_retry_s)
        for name, ok in (("batch_window_ms", self.batch_window_ms >= 0), ("max_batch", self.max_batch >= 1),
                         ("max_concurrency", self.max_concurrency >= 1), ("max_pending", self.max_pending >= 1),
                         ("port", 0 <= self.port < 65536)):
            if not ok:
                raise ConfigError(name, getattr(self, name), "out of range", f"see captionrl serve reward --help for {name}")


def build_judge(cfg: RewardServiceConfig, backend: Any = None) -> Any:
    """The judge ``cfg.reward`` names, on ``backend`` (built from ``cfg.backend`` when not given)."""
    if cfg.reward == "cider":
        from captionrl.judges.ngram import NgramJudge

        return NgramJudge(cfg.ngram, field_prefix="ngram")  # refuses to start without the training references
    if backend is None:
        from captionrl.backends import make_backend

        backend = make_backend(cfg.backend)
    if cfg.reward == "identification":
        from captionrl.judges.identification import IdentificationJudge

        return ShapedJudge(IdentificationJudge(backend, cfg.identify), cfg.shaping)
    if cfg.reward == "scalar":
        from captionrl.judges.scalar import ScalarJudge

        return ScalarJudge(backend, cfg.scalar)
    if cfg.reward == "answerability":
        from captionrl.judges.qa import QAJudge

        return QAJudge(backend, cfg.qa)
    from captionrl.judges.rubric import RubricJudge, RubricStore

    store = RubricStore(cfg.rubric.store) if cfg.rubric.store else None
    return RubricJudge(backend, mode=cfg.rubric.mode, decision=cfg.rubric.decision,  # type: ignore[arg-type]
                       threshold=cfg.rubric.threshold, store=store)


class ShapedJudge:
    """An identification judge whose scores are shaped exactly as in training (``rewards.shaping``): the
    transcription guard and the factuality term measured against the true series (candidate 0). A caption
    the judge could not score stays unscored; the shaping terms travel in ``extra`` for the response logs."""

    def __init__(self, judge: Any, shaping: ShapingConfig) -> None:
        from captionrl.rewards.shaping import ShapedReward

        self.judge_ = judge
        self.backend = getattr(judge, "backend", None)  # /health reports a replicated verifier's replicas
        self.name = getattr(judge, "name", "identification")
        self.shaper = ShapedReward(lambda *a, **k: [], shaping, name="serve")

    def judge(self, captions: list[str], columns: dict[str, Any]) -> list[Any]:
        import dataclasses

        judgments = self.judge_.judge(captions, columns)
        shaped = self.shaper.shape(list(captions), [j.score if j.scored else None for j in judgments],
                                   series=[c[0] for c in columns["candidates"]])
        out = []
        for j, s in zip(judgments, shaped, strict=True):
            t = s.transcription
            extra = {**j.extra, "base": s.base, "copied_values": float(t.copied) if t else 0.0,
                     "transcription_penalty": s.transcription_penalty, "factuality_penalty": s.factuality_penalty}
            out.append(dataclasses.replace(j, score=s.reward, extra=extra) if j.scored else j)
        return out
