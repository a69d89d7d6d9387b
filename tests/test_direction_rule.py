"""``reward.direction_rule: label``: the description term pays an overall direction only when it is the
window's one label, so on the main job's balanced training windows no constant direction word is paid above
its share, and only a direction that tracks the window beats one said of every window.

Why (docs/main-job.md): the claim checker accepts "stays roughly flat" of a window that
rises by less than its tolerance, so under ``claims`` a constant "flat" was paid the direction on 45% of the
balanced training windows against 33% for "rises", and RL can learn to say "flat" of every window. Real data: the embedded corpus's windows as ``configs/lineup-cpu.yaml`` draws them."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.domains.describe import overall_direction
from captionrl.domains.lineup_data import build_lineup_data
from captionrl.errors import ConfigError
from captionrl.judges.key_facts import key_facts, with_labelled_direction
from captionrl.rewards.shaping import Shaper, ShapingConfig
from captionrl.train.lineup_config import LineupConfig

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "lineup-cpu.yaml"
WORDS = {"up": "rises", "down": "falls", "flat": "stays roughly flat"}


@pytest.fixture(scope="module")
def train_windows() -> list[np.ndarray]:
    cfg = load_config(LineupConfig, CONFIG)
    return [np.asarray(r["series"], dtype=float) for r in build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]]


INSTRUCTION = ("In one or two short sentences, say the value the series starts at, the value it ends at, and whether "
               "it rises or falls overall.")


def shaper(rule: str) -> Shaper:
    """The main job's description term (coverage 1, target 4, direction worth 4 facts, 0.25 per wrong fact)."""
    return Shaper(instruction=INSTRUCTION, cfg=ShapingConfig(coverage_bonus=1.0, coverage_target=4, direction_weight=4, wrong_fact_penalty=0.25,
                                no_fact_penalty=0.5, degenerate_penalty=1.0, transcription_penalty=0.0,
                                run_penalty=0.0, direction_rule=rule))


def sentence(word: str, v: np.ndarray) -> str:
    return f"Overall, the series {word}. It starts at {v[0]:.2f} and ends at {v[-1]:.2f}."


def mean_terms(rule: str, captions: list[str], windows: list[np.ndarray]) -> tuple[float, float]:
    """(share of captions paid the direction, mean description term) under ``rule``."""
    shaped = shaper(rule).shape(captions, [0.0] * len(captions), series=[v.tolist() for v in windows])
    return (float(np.mean([bool(s.facts.direction_correct) for s in shaped])),
            float(np.mean([s.description_term for s in shaped])))


def test_balanced_windows_are_balanced_by_the_label_the_reward_reads(train_windows):
    """The balance draws by ``overall_direction`` (slope and endpoints), the label the describer, the warm start
    and ``direction_rule: label`` use; the slope-only rule it used left 49 flat, 41 rising, 38 falling."""
    counts = Counter(overall_direction(v) for v in train_windows)
    assert set(counts) == {"up", "down", "flat"} and max(counts.values()) - min(counts.values()) <= 1, counts


def test_no_constant_direction_is_paid_above_its_share_under_label(train_windows):
    paid = {w: mean_terms("label", [sentence(WORDS[w], v) for v in train_windows], train_windows) for w in WORDS}
    for w, (share, _) in paid.items():
        assert abs(share - 1 / 3) < 0.02, (w, paid)
    tracking = mean_terms("label", [sentence(WORDS[overall_direction(v)], v) for v in train_windows], train_windows)
    assert tracking[0] == 1.0 and tracking[1] > max(term for _, term in paid.values()) + 0.4, (tracking, paid)


def test_the_claim_checker_pays_constant_flat_above_its_share(train_windows):
    """Why the rule exists: under ``claims`` the same constant "flat" is paid well above a third, and above a
    constant "rises"; a reward change that made the checker strict would show here."""
    flat, _ = mean_terms("claims", [sentence("stays roughly flat", v) for v in train_windows], train_windows)
    rises, _ = mean_terms("claims", [sentence("rises", v) for v in train_windows], train_windows)
    assert flat > 0.4 and flat > rises + 0.08, (flat, rises)


def test_a_tolerated_direction_that_is_not_the_label_is_a_wrong_fact(train_windows):
    tolerated = next(v for v in train_windows if overall_direction(v) != "flat"
                     and key_facts(sentence("stays roughly flat", v), v).direction_correct)
    kf = key_facts(sentence("stays roughly flat", tolerated), tolerated)
    strict = with_labelled_direction(kf, tolerated)
    assert "direction" in kf.facts and not strict.direction_correct
    assert "direction" in strict.wrong and "direction" not in strict.facts
    assert (strict.correct_facts, strict.wrong_facts) == (kf.correct_facts - 1, kf.wrong_facts + 1)
    right = key_facts(sentence(WORDS[overall_direction(tolerated)], tolerated), tolerated)
    assert with_labelled_direction(right, tolerated) == right  # the label itself is untouched


@pytest.mark.parametrize("caption", ["355.10", INSTRUCTION, "Overall, the series rises."])
def test_degenerate_outputs_gain_nothing_under_label(train_windows, caption):
    """A bare number, the instruction echoed, and one template sentence for every window score below the
    honest describer's sentence under the label rule, as under the checker's."""
    honest = mean_terms("label", [sentence(WORDS[overall_direction(v)], v) for v in train_windows], train_windows)[1]
    lazy = mean_terms("label", [caption] * len(train_windows), train_windows)[1]
    assert lazy < honest - 0.5, (caption, lazy, honest)


def test_an_unknown_rule_is_an_error_naming_the_field():
    with pytest.raises(ConfigError, match=r"reward\.direction_rule.*strict.*claims, label"):
        ShapingConfig(direction_rule="strict")
