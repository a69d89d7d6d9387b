"""Shape claims (judges.shape_claims), key facts (judges.key_facts) and their agreement with people.

Real parts: hand-labelled captions of real windows (tests/data/shape_captions.jsonl: statsmodels co2,
sunspots, elec_equip, nile, elnino, macrodata, E6), the embedded corpus, the describer. No model; ~2 s.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from captionrl.domains.describe import describe_series, overall_direction
from captionrl.errors import DataError
from captionrl.judges.claim_labels import load_labelled, score
from captionrl.judges.claims import check, extract_rules, factuality
from captionrl.judges.key_facts import echoes_instruction, key_facts
from captionrl.judges.shape_claims import SHAPE_KINDS

DATA = Path(__file__).resolve().parent / "data" / "shape_captions.jsonl"
# The main job's instruction (configs/lineup-cpu.yaml)
INSTRUCTION = ("In one or two short sentences, say the value the series starts at, the value it ends at, and "
               "whether it rises or falls overall.")


@pytest.fixture(scope="module")
def records():
    return load_labelled(DATA)


@pytest.fixture(scope="module")
def scores(records):
    return score(records)


def colours(caption, series):
    v = np.asarray(series, dtype=float)
    return [(check(c, v).colour, c.kind, c.text) for c in extract_rules(caption)]


def shape_colours(caption, series):
    return [(col, kind) for col, kind, _ in colours(caption, series) if kind in SHAPE_KINDS]


# ----------------------------------------------------------------------------- agreement with people
def test_the_labelled_set_is_large_real_and_mixed(records):
    assert len(records) >= 150
    assert len({r["source"] for r in records}) >= 40 and {len(r["series"]) for r in records} >= {16, 32, 64}
    splits = {r["split"] for r in records}
    assert splits == {"dev", "holdout", "holdout2"}
    truths = [t for r in records for t in r["labels"].values()]
    assert truths.count(True) >= 100 and truths.count(False) >= 100


# Measured on the whole set (bench/bench_shape_claims.py, docs/claims.md): green precision 1.00 for every
# kind, green recall 0.88 (magnitude) to 1.00, red precision 0.90 (stretch) to 1.00, red recall 1.00,
# extraction recall 0.94 to 1.00. The floors sit a few captions below each measured figure (about 0.05 for
# the large kinds, more for the small ones), so a rule that breaks a handful of captions fails here.
FLOORS = {  # kind: (green precision, green recall, red precision, red recall, extraction recall)
    "value": (0.95, 0.9, 0.8, 0.8, 0.9),
    "trend": (0.95, 0.93, 0.95, 0.95, 0.95),
    "extremum": (0.95, 0.93, 0.95, 0.95, 0.95),
    "stretch": (0.93, 0.88, 0.8, 0.9, 0.93),
    "volatility": (0.95, 0.93, 0.9, 0.9, 0.95),
    "magnitude": (0.9, 0.78, 0.85, 0.9, 0.87),
}


@pytest.mark.parametrize("kind", sorted(FLOORS))
def test_precision_and_recall_per_kind(scores, kind):
    s = scores[kind]
    got = (s.precision, s.recall, s.red_precision, s.red_recall, s.extraction_recall)
    assert all(x is not None and x >= floor for x, floor in zip(got, FLOORS[kind], strict=True)), (kind, got, s.misses)


def test_every_hedge_is_caught_and_red(scores):
    h = scores["hedge"]
    assert h.labelled == h.tn >= 15 and h.fp == h.missed_false == 0


def test_held_out_captions_are_not_worse_than_chance_by_far(records):
    """The second held-out part was written after the rules were revised on everything else; it is the
    honest estimate, so it must stay well above chance for the kinds it has enough of."""
    s = score([r for r in records if r["split"] == "holdout2"])
    assert s["extremum"].precision >= 0.9 and s["extremum"].recall >= 0.85
    assert s["trend"].red_recall >= 0.75 and s["volatility"].recall >= 0.8


def test_bad_label_files_are_refused(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text('{"id": "a", "series": [1, 2, 3], "caption": "Rises.", "labels": {"direction": true}}\n')
    with pytest.raises(DataError, match="labels"):
        load_labelled(bad)
    with pytest.raises(DataError, match="not found"):
        load_labelled(tmp_path / "missing.jsonl")


# ------------------------------------------------------------------------------- specific phrasings
RISE = np.array([1, 1.2, 1.1, 1.5, 1.7, 1.6, 2.0, 2.2, 2.1, 2.5, 2.7, 2.6, 3.0, 3.2, 3.1, 3.4])
HUMP = np.array([1, 2, 3.5, 5, 6.5, 8, 9, 9.5, 9, 8, 6.5, 5, 3.5, 2.5, 2, 1.5])
V_SHAPE = HUMP.max() - HUMP
ELNINO = np.array([21.31, 21.37, 21.6, 22.81, 24.23, 25.73, 26.47, 24.53, 23.64, 22.09, 21.36, 20.67, 20.08, 20.46,
                   20.62, 22.42])
E6_U = np.array([0.11, 0.1, 0.09, 0.08, 0.09, 0.09, 0.08, 0.08, 0.08, 0.07, 0.07, 0.06, 0.06, 0.06, 0.06, 0.06, 0.06,
                 0.07, 0.07, 0.08, 0.08, 0.08, 0.1, 0.08, 0.08, 0.09, 0.1, 0.11, 0.11, 0.1, 0.1, 0.09])
DROP_END = np.array([5, 5.1, 5.0, 5.2, 5.1, 5.0, 5.1, 5.2, 5.1, 5.0, 5.1, 5.0, 4.9, 3.5, 2.0, 1.0]) + 20


@pytest.mark.parametrize(("caption", "series", "kind", "colour"), [
    ("Slow increase, peak at the end.", RISE, "trend", "green"),
    ("Slow increase, peak at the end.", RISE, "extremum", "green"),
    ("It falls overall.", RISE, "trend", "red"),
    # a least-squares line that falls on a window that ends above its start (elnino[584:600]): neither way
    ("The series falls overall.", ELNINO, "trend", "red"),
    ("It rises overall.", ELNINO, "trend", "red"),
    ("No clear overall trend.", ELNINO, "trend", "green"),
    ("It rises overall.", E6_U, "trend", "red"),  # a rising line on a U that ends below its start (E6 R[9:41])
    # a move is read against the value stated before it: 4 is reached from below, but not from 10
    ("It starts at 10 and rises to 4.", np.array([10, 8, 6, 4, 2, 3, 4, 5, 6, 5, 4.5, 4, 4, 4.2, 4.1, 4]),
     "stretch", "red"),
    ("It starts at 2 and rises to 4.", np.array([2, 3, 4, 5, 6, 5, 4.5, 4, 4, 4.2, 4.1, 4, 4, 4, 4, 4]),
     "stretch", "green"),
    ("Peak in the middle.", HUMP, "extremum", "green"),
    ("Peak in the middle.", V_SHAPE, "extremum", "red"),
    ("Lowest at the start.", RISE, "extremum", "green"),
    ("A trough early on.", V_SHAPE, "extremum", "red"),
    ("Rises then falls.", HUMP, "stretch", "green"),
    ("Rises then falls.", RISE, "stretch", "red"),
    ("Falls until the middle, then recovers.", V_SHAPE, "stretch", "green"),
    ("Falls until the middle, then recovers.", HUMP, "stretch", "red"),
    ("A dip in the middle.", V_SHAPE, "stretch", "green"),
    ("A dip in the middle.", HUMP, "stretch", "red"),
    ("Flat in the middle.", DROP_END, "stretch", "green"),
    ("Flat in the middle.", RISE, "stretch", "red"),
    ("flat in middle, drops sharply at end", DROP_END, "stretch", "green"),  # caption shorthand, no articles
    ("Climbs steadily from start to finish.", RISE, "trend", "green"),
    ("Climbs steadily from start to finish.", HUMP, "trend", "red"),
    ("Drops sharply at the end.", DROP_END, "stretch", "green"),
    ("Drops sharply at the end.", DROP_END, "magnitude", "green"),
    ("Drops sharply at the end.", RISE, "magnitude", "red"),
    ("Increases steadily in the first half.", HUMP, "stretch", "green"),
    ("Increases steadily in the first half.", V_SHAPE, "stretch", "red"),
    ("Levels off at the end.", DROP_END, "stretch", "red"),
    ("Smooth.", HUMP, "volatility", "green"),  # large steps for its level, but a smooth curve
    ("Volatile and noisy.", HUMP, "volatility", "red"),
    ("Volatile and noisy.", RISE + np.tile([0, 1.5], 8), "volatility", "green"),
    ("Smooth.", RISE + np.tile([0, 1.5], 8), "volatility", "red"),
    ("It fluctuates a lot.", RISE, "volatility", "red"),
    ("The series doubles.", np.linspace(10, 20, 16), "magnitude", "green"),
    ("The series halves.", np.linspace(10, 20, 16), "magnitude", "red"),
    ("Rises slightly overall.", np.linspace(350, 352, 16), "magnitude", "green"),
    ("A large jump in the middle.", np.r_[np.zeros(8), np.ones(8)] + 3, "magnitude", "green"),
    ("Stable throughout.", HUMP, "trend", "red"),
    ("No clear trend.", HUMP, "trend", "green"),
    ("It rises or falls overall.", RISE, "hedge", "red"),
    ("It increases or decreases.", HUMP, "hedge", "red"),
    ("It goes up and down overall.", HUMP, "hedge", "red"),
])
def test_phrasings(caption, series, kind, colour):
    got = [col for col, k, _ in colours(caption, series) if k == kind]
    assert got and all(c == colour for c in got), (caption, colours(caption, series))


def test_trained_captioner_moves_are_checked_against_what_precedes_them():
    """Issue 32: "... rises to 28.55, falls to 29.21" (a fall to a higher value) on a window ending at 27.24."""
    v = np.array([25.92, 26.3, 26.9, 27.5, 28.0, 28.55, 28.3, 28.1, 27.9, 27.6, 27.7, 27.5, 27.4, 27.3, 27.3, 27.24])
    cap = "The value the series starts at 25.92, ends at 28.11, and rises to 28.55, falls to 29.21"
    got = colours(cap, v)
    assert ("green", "value", "The value the series starts at 25.92") in got
    assert ("red", "value", "ends at 28.11") in got  # the window ends at 27.24
    assert ("green", "stretch", "rises to 28.55") in got and ("red", "stretch", "falls to 29.21") in got
    k = key_facts(cap, v, instruction=INSTRUCTION)
    assert k.degenerate == "instruction echoed" and "start value" in k.facts and {"end value", "shape"} <= set(k.wrong)


def test_a_direction_next_to_a_number_is_not_an_overall_trend():
    v = np.array([5, 4, 3, 2, 1, 1.5, 0.5, 2, 3, 4.0])
    kinds = [k for _, k, _ in colours("It falls steadily to a trough of 0.5 at step 6 before rebounding to 4 at step 9.", v)]
    assert "trend" not in kinds and "stretch" in kinds


def test_the_describer_states_the_direction_the_checker_reads():
    """The honest reference and the checker share one direction rule: on real windows the describer's
    direction is never red, and its caption states seven key facts."""
    from captionrl.domains.datasets import split_windows

    windows = split_windows("embedded", 16)["train"][:80]
    for w in windows:
        cap = describe_series(w)
        f = factuality(cap, w.values)
        assert f.red == 0, (cap, [c for c in colours(cap, w.values) if c[0] == "red"])
        k = key_facts(cap, w.values, instruction=INSTRUCTION)
        assert k.degenerate is None and k.direction_stated and k.direction_correct and k.correct_facts == 7
    assert {overall_direction(w.values) for w in windows} == {"up", "down", "flat"}


# ------------------------------------------------------------------------------- degenerate outputs
@pytest.fixture(scope="module")
def windows():
    from captionrl.domains.datasets import split_windows

    return split_windows("embedded", 16)["test"][:40]


def test_a_bare_number_asserts_nothing(windows):
    for w in windows:
        cap = f"{w.values[0]:.2f}"
        assert not [c for c in colours(cap, w.values) if c[0] in ("green", "red")]
        k = key_facts(cap, w.values, instruction=INSTRUCTION)
        assert k.degenerate == "no words" and k.correct_facts == 0 and not k.direction_stated


def test_the_echoed_instruction_is_a_wrong_hedge_with_or_without_values(windows):
    for w in windows:
        for cap in (INSTRUCTION,
                    f"The value the series starts at {w.values[0]:.2f}, the value it ends at {w.values[-1]:.2f}, "
                    f"and whether it rises or falls overall.",
                    f"In one or two short sentences: the series starts at {w.values[0]:.2f} and it rises or falls overall."):
            shape = shape_colours(cap, w.values)
            assert shape and all(c == ("red", "hedge") for c in shape), (cap, shape)
            k = key_facts(cap, w.values, instruction=INSTRUCTION)
            assert k.degenerate == "instruction echoed" and k.hedge and "hedge" in k.wrong
            assert not k.direction_stated and k.direction_correct is None


def test_one_template_sentence_for_every_item_earns_no_shape_and_no_direction(windows):
    for w in windows:
        cap = f"The series starts at {w.values[0]:.2f}, which is the first value in the series."
        assert shape_colours(cap, w.values) == []
        k = key_facts(cap, w.values, instruction=INSTRUCTION)
        assert k.facts == ("start value",) and not k.direction_stated and k.wrong_facts == 0


def test_the_hedge_counts_as_wrong_and_costs_factuality():
    hedged = factuality("It starts at 1 and ends at 3.4, and it rises or falls overall.", RISE)
    honest = factuality("It starts at 1 and ends at 3.4, and it rises overall.", RISE)
    assert hedged.red == 1 and honest.red == 0 and hedged.green_share < honest.green_share
    k = key_facts("It starts at 1 and ends at 3.4, and it rises or falls overall.", RISE)
    assert k.hedge and k.wrong == ("hedge",) and k.net_facts == 1


# ------------------------------------------------------------------------------------------ key facts
def test_facts_are_distinct_and_a_contradiction_is_wrong():
    once = key_facts("It rises overall, and it peaks at the end.", RISE)
    twice = key_facts("It rises overall. It rises. It increases overall, and it peaks at the end.", RISE)
    assert once.facts == twice.facts == ("direction", "max position") and once.correct_facts == twice.correct_facts == 2
    contradicted = key_facts("It rises overall. It falls overall. Highest at the end.", RISE)
    assert contradicted.facts == ("max position",) and contradicted.wrong == ("direction",)
    assert contradicted.direction_stated and contradicted.direction_correct is False


def test_extrema_name_where_and_whether():
    k = key_facts("Peaks in the middle and is lowest at the start; the maximum is 9.5 at step 7.", HUMP)
    assert {(e.stat, e.where, e.correct) for e in k.extrema} == {("max", "middle", True), ("min", "start", True),
                                                                 ("max", "step 7", True)}
    assert {"max value", "max position", "min position"} <= set(k.facts)


@pytest.mark.parametrize(("caption", "echo"), [
    (INSTRUCTION.upper(), True),
    (INSTRUCTION.replace(",", "").replace(".", "!"), True),
    ("whether it rises or falls overall", True),  # 6 consecutive instruction words
    ("The value the series starts at 5, the value it ends at 7, and whether it rises or falls overall.", True),
    ("It starts at 5 and ends at 7, and it rises overall.", False),
    ("The series starts at 5, the value it ends at is 7, and it rises overall.", True),  # 9 words, numbers out
    ("It starts at 5, ends at 7 and rises overall.", False),
    ("", False),
])
def test_instruction_echo(caption, echo):
    assert echoes_instruction(caption, INSTRUCTION) is echo


def test_short_instructions_and_short_captions():
    assert echoes_instruction("Describe the series.", "Describe the series.")
    assert not echoes_instruction("The series rises steadily to a peak.", "Describe the series.")
    assert key_facts("Rises.", RISE).degenerate == "under 5 words"
    assert key_facts("Rises overall, with its peak at the end.", RISE).degenerate is None


def test_long_windows_are_read_on_their_chart():
    """A 512-value window: stretches and sequences are read on its 64-point chart (what a reader sees), so a
    sequence check costs what it costs on 64 values and the noise of single steps does not decide it."""
    import time

    rng = np.random.default_rng(0)
    t = np.linspace(0, 1, 512)
    v = 10 * np.sin(np.pi * t) + rng.normal(0, 0.8, 512)  # a noisy hump
    start = time.process_time()
    got = [(col, kind) for col, kind, _ in colours("Rises then falls, a peak in the middle. Steady rise.", v)]
    assert time.process_time() - start < 2.0
    assert got == [("green", "stretch"), ("green", "extremum"), ("red", "trend")]
    assert colours("Falls then rises.", v)[0][0] == "red"



def test_first_and_last_value_phrasings_are_start_and_end_claims():
    """A trained captioner wrote 'The first value is X, and the last value is Y.' for every window; both
    values went unread (no key fact, no red) until 'first/last value is' was a start/end claim."""
    import numpy as np

    from captionrl.judges.key_facts import key_facts

    v = np.array([355.1, 355.6, 356.0, 357.0, 358.0, 359.6])
    assert key_facts("The first value is 355.10, and the last value is 359.60.", v).facts == ("start value", "end value")
    assert key_facts("The series begins with 355.10 and finishes at 359.60.", v).facts == ("start value", "end value")
    assert key_facts("The final value is 300.", v).wrong == ("end value",)
