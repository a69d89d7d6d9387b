"""The transcription guard: copies matched by value at the caption's rounding, runs, a count allowance."""

from __future__ import annotations

import pytest

from captionrl.errors import ConfigError
from captionrl.judges.transcription import TranscriptionConfig, caption_numbers, parse_shown, transcription

SERIES = [354.2987, 355.1, 356.02, 354.7, 353.9, 1234.5, -7.06, 2.11, 3491.3, 3491.3]


def test_values_match_at_the_captions_rounding():
    t = transcription("The peak is 354.3, later 354.30 and 354 again.", SERIES)
    assert t.copied == 3 and t.distinct == 2  # "354" is 354.2987 or 353.9 at zero decimals
    assert transcription("The level is 354.4.", SERIES).copied == 0  # 354.2987 rounds to 354.3, not 354.4


def test_negatives_and_thousands_separators():
    t = transcription("It dips to -7.06 and reaches 1,234.5.", SERIES)
    assert t.copied == 2
    assert transcription("It dips to 7.06.", SERIES).copied == 0  # the sign is part of the value


def test_positions_counts_and_short_numbers_are_not_values():
    assert caption_numbers("It has 10 points; the maximum is at step 2, value 2.11.", min_significant=2)[0].value == 2.11
    assert transcription("10 values; at step 2 it is 2 or -1.", SERIES).copied == 0


def test_runs_of_consecutive_values_are_always_penalised():
    cfg = TranscriptionConfig(max_copied_values=10, min_run=3, run_penalty=1.0, value_penalty=0.1)
    run = transcription("Values: 355.10, 356.02, 354.70.", SERIES, cfg)
    assert run.longest_run == 3 and run.run_values == 3 and run.penalty == pytest.approx(1.0)
    scattered = transcription("Peak 356.02, start 354.3 and end 3491.3.", SERIES, cfg)
    assert scattered.longest_run == 1 and scattered.penalty == 0.0
    broken = transcription("355.10, 356.02, 9.99, 354.70", SERIES, cfg)  # an uncopied number breaks the run
    assert broken.longest_run == 2 and broken.penalty == 0.0


def test_allowance_is_a_count_and_the_penalty_grows_per_value():
    cfg = TranscriptionConfig(max_copied_values=2, value_penalty=0.25, min_run=3)
    t = transcription("Key values 1234.5, 354.3, -7.06 and 2.11.", SERIES, cfg)
    assert (t.copied, t.excess) == (4, 2) and t.penalty == pytest.approx(0.5)


def test_dump_of_repeated_values_counts_every_copy():
    t = transcription("The series (3491.30, 3491.30, 3491.30, ...", SERIES)
    assert t.copied == 3 and t.distinct == 2 and t.longest_run == 2


def test_shown_values_count_too():
    shown = parse_shown("0.10, -1.20, 0.55")
    t = transcription("It starts at 0.10 and dips to -1.2, then 0.55.", [10.0, 8.0, 11.0], shown=shown)
    assert t.copied == 3 and t.has_run


def test_lists_without_spaces_are_split():
    assert transcription("354,355,356", [354.0, 355.0, 356.0]).run_values == 3


def test_bad_config_is_named():
    with pytest.raises(ConfigError, match="min_run"):
        TranscriptionConfig(min_run=1)
