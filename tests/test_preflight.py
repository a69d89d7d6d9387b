"""Reward preflight with the real embedded verifier: the CPU config's shaped reward passes; the same
likelihood verifier with the transcription guard (and the factuality term) switched off is refused,
because the number dump wins it; ``train.force_preflight`` starts anyway and the table is saved."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from captionrl.config import load_config
from captionrl.domains.lineup_data import build_lineup_data
from captionrl.preflight import PreflightError, run_preflight, sample_rows, series_references
from captionrl.rewards import RewardFunction
from captionrl.rewards.reward import build_reward
from captionrl.rewards.shaping import Shaper
from captionrl.train import lineup

ROOT = Path(__file__).resolve().parents[1]
N_ITEMS = 2
UNGUARDED = ["reward.transcription_penalty=0", "reward.run_penalty=0", "reward.factuality_penalty=0", "reward.factuality_bonus=0",
             "reward.unfinished_penalty=0", "reward.length_penalty=0", "reward.number_penalty=0",
             "reward.coverage_bonus=0", "reward.wrong_fact_penalty=0", "reward.degenerate_penalty=0",
             "reward.no_fact_penalty=0", "reward.lam=1.0"]  # every shaping term off: the bare verifier


NUMBERS_ONLY = ["reward.factuality_bonus=1.0", "reward.factuality_penalty=1.0", "reward.lam=1.0",
                "reward.coverage_bonus=0", "reward.wrong_fact_penalty=0", "reward.no_fact_penalty=0",
                "reward.degenerate_penalty=0", "reward.direction_weight=1"]  # a reward with no description terms


class _Remembered:
    """The embedded verifier with each (context, continuation) pair scored once: the three preflights below
    score the same probes of the same rows under three rewards, so only the first pays the model; the
    shaping terms, the margins and the refusals still run on its real scores."""

    def __init__(self, backend) -> None:
        self._backend = backend
        self._scores: dict[tuple[str, str], float | None] = {}
        self.scored = 0  # pairs the model scored
        self.calls = 0  # calls asking for scores, remembered or not

    def loglikelihood(self, pairs):
        self.calls += 1
        new = [p for p in dict.fromkeys(pairs) if p not in self._scores]
        if new:
            self._scores.update(zip(new, self._backend.loglikelihood(new), strict=True))
            self.scored += len(new)
        return [self._scores[p] for p in pairs]

    def __getattr__(self, name):
        return getattr(self._backend, name)


def _setup(backend, overrides):
    cfg = load_config(lineup.LineupConfig, ROOT / "configs" / "lineup-cpu.yaml", ["data.n_train=8", *overrides])
    rows = sample_rows(build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"], N_ITEMS, cfg.seed)
    reward = RewardFunction(build_reward(cfg.reward, backend, series=cfg.series_print(), name="lineup",
                                         series_rows=True))
    honest, dumps = series_references(rows, cfg.data.precision)
    return cfg, rows, reward, honest, dumps


def test_sample_is_seeded_and_dumps_are_the_shown_numbers():
    rows = [{"item_id": str(i), "series": [1.0, 2.0, 3.5], "series_text": "1.00, 2.00, 3.50"} for i in range(20)]
    assert sample_rows(rows, 5, 0) == sample_rows(rows, 5, 0) != sample_rows(rows, 5, 1)
    honest, dumps = series_references(rows[:1])
    assert dumps == ["Values: 1.00, 2.00, 3.50"] and "starts at 1" in honest[0]


class _Fixed:
    """A stand-in reward (refusal path only): ``by_caption(caption, its row's series)``."""

    def __init__(self, by_caption):
        self.by_caption = by_caption

    def __call__(self, prompts=None, completions=(), completion_ids=None, **kw):
        return [self.by_caption(c[-1]["content"], s) for c, s in zip(completions, kw["series"], strict=True)]


def test_refusal_names_the_winner_and_the_keys_and_unscored_honest_refuses(tmp_path):
    rows = [{"prompt": "p", "series": [1.0, 2.0, 3.0], "series_text": "1.00, 2.00, 3.00"},
            {"prompt": "p", "series": [5.0, 2.0, 1.0], "series_text": "5.00, 2.00, 1.00"}]
    honest, dumps = series_references(rows)
    praise = _Fixed(lambda c, s: 1.0 if "accurate" in c else 0.9 if c == series_references([{"series": s}])[0][0]
                    else 0.1)
    with pytest.raises(PreflightError, match=r"(?s)self_praise.*train.force_preflight=true") as err:
        run_preflight(praise, rows, honest, dumps, keys=["reward.mode"], out_dir=tmp_path)
    assert "reward.mode" in str(err.value)
    saved = json.loads((tmp_path / "preflight.json").read_text())
    assert saved["passed"] is False and saved["winners"] == ["self_praise"]
    forced = run_preflight(praise, rows, honest, dumps, force=True, out_dir=tmp_path / "forced", echo=False)
    assert forced.forced and forced.winners == ["self_praise"]
    assert "FAILED, forced" in (tmp_path / "forced" / "preflight.md").read_text()
    with pytest.raises(PreflightError, match="scored no honest reference"):
        run_preflight(_Fixed(lambda c, s: None), rows, honest, dumps)


@pytest.mark.slow
def test_preflight_passes_the_cpu_config_and_refuses_an_unguarded_likelihood_reward(tmp_path, embedded_backend):
    verifier = _Remembered(embedded_backend)
    _, rows, reward, honest, dumps = _setup(verifier, [])
    from captionrl.preflight import series_extra_probes

    cfg = load_config(lineup.LineupConfig, ROOT / "configs" / "lineup-cpu.yaml")
    ok = run_preflight(reward, rows, honest, dumps, keys=lineup.PREFLIGHT_KEYS, out_dir=tmp_path / "ok",
                       extra=series_extra_probes(rows, cfg.instruction()), margin=cfg.train.preflight_margin)
    assert ok.passed and not ok.winners
    means = {r.probe: r.mean for r in ok.rows}
    assert all(means[p] < means["honest"] - cfg.train.preflight_margin for p in means if p != "honest")
    assert {"start_only", "start_sentence", "key_values", "echo_values", "wrong_direction", "hedge"} <= set(means)
    assert "honest" in (tmp_path / "ok" / "preflight.md").read_text()
    # a series value named as the extreme it is not loses to the same answer without it...
    assert means["wrong_extreme"] < means["answer"]
    # ...only because the false claim keeps no more than chance's identification: kept in full, the lineup pays it
    _, rows, full, honest, dumps = _setup(verifier, ["reward.false_claim_base=full"])
    with pytest.raises(PreflightError, match=r"wrong_extreme") as err:
        run_preflight(full, rows, honest, dumps, keys=lineup.PREFLIGHT_KEYS, out_dir=tmp_path / "full",
                      extra=series_extra_probes(rows, cfg.instruction()), margin=cfg.train.preflight_margin)
    assert "reward.false_claim_base" in str(err.value)
    assert json.loads((tmp_path / "full" / "preflight.json").read_text())["winners"] == ["wrong_extreme"]
    # the number budget prices a list of invented values (one a window value, 6 over the budget of 10 at 0.1
    # each): without it the probe scores that much more, or wins outright
    _, rows, free, honest, dumps = _setup(verifier, ["reward.number_penalty=0"])
    try:
        unpriced = run_preflight(free, rows, honest, dumps, keys=lineup.PREFLIGHT_KEYS, out_dir=tmp_path / "free",
                                 extra=series_extra_probes(rows, cfg.instruction()), margin=cfg.train.preflight_margin)
        gap = {r.probe: r.mean for r in unpriced.rows}["invented_values"] - means["invented_values"]
        assert gap == pytest.approx(0.6, abs=0.05)
    except PreflightError as exc:
        assert "invented_values" in str(exc)

    # a share bonus and no description terms: one copied value wins it
    scored = verifier.scored
    _, rows, reward, honest, dumps = _setup(verifier, NUMBERS_ONLY)
    with pytest.raises(PreflightError, match="start_only") as err:
        run_preflight(reward, rows, honest, dumps, keys=lineup.PREFLIGHT_KEYS, out_dir=tmp_path / "numbers",
                      extra=series_extra_probes(rows, cfg.instruction()), margin=cfg.train.preflight_margin)
    assert "train.preflight_margin" in str(err.value)

    _, rows, reward, honest, dumps = _setup(verifier, UNGUARDED)
    with pytest.raises(PreflightError, match="dump") as err:  # the bare verifier: the number dump wins it
        run_preflight(reward, rows, honest, dumps, keys=lineup.PREFLIGHT_KEYS, out_dir=tmp_path / "bad")
    assert "reward.transcription_penalty" in str(err.value)
    assert json.loads((tmp_path / "bad" / "preflight.json").read_text())["winners"][0] == "dump"
    assert scored > 0 and verifier.scored == scored  # the same probes of the same rows: scored once


def test_a_resumed_run_does_not_score_a_passed_preflight_again(tmp_path, embedded_backend):
    """The run's preflight saves what it scored (a fingerprint of the reward, the verifier and the items): the
    same preflight in the same run folder, as a resumed run asks for, reads the pass back instead of scoring;
    any change of what it depends on scores again, and a forced or failed table is never reused."""
    from captionrl.preflight import passed_before

    remembered = _Remembered(embedded_backend)
    cfg = load_config(lineup.LineupConfig, ROOT / "configs" / "lineup-cpu.yaml",
                      ["data.n_train=8", f"train.preflight_items={N_ITEMS}"])
    rows = build_lineup_data(cfg.data, cfg.reward.k, cfg.seed).rows["train"]
    reward = RewardFunction(build_reward(cfg.reward, remembered, series=cfg.series_print(), name="lineup",
                                         series_rows=True))
    first = lineup.preflight(cfg, rows, reward, tmp_path)
    assert first.passed and remembered.calls > 0
    saved = json.loads((tmp_path / "preflight.json").read_text())
    assert saved["fingerprint"] == lineup.preflight_fingerprint(cfg, sample_rows(rows, N_ITEMS, cfg.seed))
    calls = remembered.calls
    assert lineup.preflight(cfg, rows, reward, tmp_path) is None and remembered.calls == calls
    stricter = load_config(lineup.LineupConfig, ROOT / "configs" / "lineup-cpu.yaml",
                           ["data.n_train=8", f"train.preflight_items={N_ITEMS}", "train.preflight_margin=0.2"])
    assert lineup.preflight(stricter, rows, reward, tmp_path).passed and remembered.calls > calls
    other_items = lineup.preflight_fingerprint(cfg, sample_rows(rows, N_ITEMS, cfg.seed + 1))
    assert not passed_before(tmp_path, other_items) and not passed_before(tmp_path, "")
    saved = json.loads((tmp_path / "preflight.json").read_text())
    for forced_or_failed in ({"forced": True}, {"passed": False}):
        (tmp_path / "preflight.json").write_text(json.dumps({**saved, **forced_or_failed}))
        assert not passed_before(tmp_path, saved["fingerprint"])
    (tmp_path / "preflight.json").write_text("{not json")
    assert not passed_before(tmp_path, saved["fingerprint"])


def test_invented_values_escape_the_guard_and_the_number_budget_prices_them():
    from captionrl.judges.transcription import transcription
    from captionrl.preflight import invented_values
    from captionrl.rewards.shaping import ShapingConfig, count_numbers

    series = [10.0, 10.5, 11.2, 12.0, 11.7, 11.1, 10.4, 9.8]
    text = invented_values([{"series": series}], precision=2)[0]
    assert count_numbers(text) == len(series)
    assert transcription(text, series).copied == 0  # no value matches the series at any rounding: the guard is blind
    budget = Shaper(ShapingConfig(max_numbers=3, number_penalty=0.1))
    assert budget.length_penalty(text) == pytest.approx(0.1 * (len(series) - 3))
    assert budget.length_penalty("It rises from 10 to 12.") == 0.0  # 2 numbers: within the budget
    assert Shaper(ShapingConfig()).length_penalty(text) == 0.0  # no budget by default
