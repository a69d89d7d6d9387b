"""The factuality finding of judges.claims: red share over checkable claims, so padding cannot dilute it."""

from __future__ import annotations

import numpy as np
import pytest

from captionrl.domains.describe import describe_series
from captionrl.errors import ConfigError
from captionrl.judges.claims import factuality
from captionrl.rewards.shaping import ShapingConfig

RISING = np.linspace(10, 40, 12)


def test_describer_is_supported_and_contradictions_are_red():
    honest = factuality(describe_series(RISING), RISING)
    assert honest.red == 0 and honest.green >= 3 and honest.red_share == 0.0
    wrong = factuality("It falls. The maximum is 2 at step 3.", RISING)
    assert wrong.red == 2 and wrong.red_share == 1.0


def test_padding_with_uncheckable_text_does_not_dilute_the_red_share():
    padded = factuality("It falls. What a lovely day. Such colours. Truly remarkable.", RISING)
    assert padded.gray >= 3 and padded.red_share == 1.0


def test_term_weights_the_share_and_llm_needs_a_backend():
    term = ShapingConfig(factuality_penalty=0.5).factuality_term()
    (f,) = term.findings(["It falls and ends at 40."], [RISING])
    assert term.penalty(f) == pytest.approx(0.5 * f.red_share) and 0 < f.red_share < 1
    with pytest.raises(ConfigError, match=r"reward\.claims_backend"):
        ShapingConfig(factuality_penalty=1.0, claims_extractor="llm")


def test_bonus_pays_supported_claims_and_no_probe_collects_it():
    term = ShapingConfig(factuality_penalty=1.0, factuality_bonus=0.5).factuality_term()
    assert ShapingConfig(factuality_bonus=0.5).factuality_term().enabled and not ShapingConfig().factuality_term().enabled
    right, wrong, dump, praise = term.findings(
        ["It starts at 10. It ends at 40.", "It starts at 25. It ends at 2.",
         " ".join(f"{v:.1f}" for v in RISING), "A clear, precise and faithful description of the series."],
        [RISING] * 4)
    assert term.penalty(right) == pytest.approx(-0.5 * right.green_share) and right.green_share == 1.0
    assert term.penalty(wrong) == pytest.approx(1.0) and wrong.green_share == 0.0
    assert term.penalty(dump) == 0.0 and term.penalty(praise) == 0.0  # no checked claim: nothing to collect
    with pytest.raises(ConfigError, match=r"reward\.factuality_bonus"):
        ShapingConfig(factuality_bonus=-0.1)


def test_past_tense_start_and_end_are_read_and_checked():
    """A trained captioner (bf16 seed 3, 2026-12-03) wrote "The series started at 359.80, and it ended at
    361.70, indicating a decline": the present-tense rules read no start or end, so wrong values went unchecked
    beside a direction that happened to be right."""
    import numpy as np

    from captionrl.judges.key_facts import key_facts

    falls = np.linspace(361.7, 359.8, 16)
    right = key_facts("The series started at 361.70, and it ended at 359.80, indicating a decline.", falls)
    assert set(right.facts) == {"start value", "end value", "direction"} and right.wrong_facts == 0
    wrong = key_facts("The series started at 355.50, and it ended at 355.80, indicating a decline.", falls)
    assert set(wrong.wrong) == {"start value", "end value"} and wrong.facts == ("direction",)
    began = key_facts("It began with 361.70 and finished at 359.80, falling overall.", falls)
    assert {"start value", "end value", "direction"} <= set(began.facts)
