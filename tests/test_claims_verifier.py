"""The claims verifier: an offline identification verifier that took no part in training.

Real parts throughout: windows of the embedded corpus, nearest-neighbour distractors (the hard case: the
distractors share the true series' summary statistics), the describer's captions, the rule extractor.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from captionrl.config import load_config
from captionrl.domains.candidates import mine_candidates
from captionrl.domains.datasets import eval_windows
from captionrl.domains.describe import describe_series
from captionrl.domains.timeseries import render_numbers
from captionrl.errors import ConfigError
from captionrl.eval.final_checks import run_final_checks
from captionrl.eval.identification import CaptionSet, IdentifyEvalConfig, run_identification
from captionrl.judges.claims_verifier import ClaimsVerifier, parse_claims_spec
from captionrl.judges.identification import IdentifyConfig, identification_judge
from captionrl.probes import GENERIC_WORDS, INJECTED_ANSWER, SELF_PRAISE, other_text

ROOT = Path(__file__).resolve().parents[1]
K = 4


@pytest.fixture(scope="module")
def lineups():
    items = eval_windows("embedded", 24, "test", 32, 0)
    sets = mine_candidates(items, items, k=K, rule="nearest", seed=0)
    pool = {it.id: it for it in items}
    distractors = {cs.item_id: list(cs.distractor_ids) for cs in sets}
    return items, pool, distractors


def _accuracy(captions, items, pool, distractors, verifier=None):
    judge = identification_judge(verifier or ClaimsVerifier(), IdentifyConfig(k=K))
    cands = [[it.values.tolist(), *[pool[d].values.tolist() for d in distractors[it.id][: K - 1]]] for it in items]
    out = judge.judge(captions, {"candidates": cands})
    assert all(j.scored for j in out)
    return float(np.mean([j.extra["hard"] for j in out])), out


def test_honest_captions_identify_their_series_and_probes_do_not_beat_chance(lineups):
    items, pool, distractors = lineups
    honest = [describe_series(it.values) for it in items]
    acc, _ = _accuracy(honest, items, pool, distractors)
    assert acc >= 0.9, acc
    # A number dump, generic text, the injected answer and self-praise make no checkable claim: every
    # candidate ties, and the credit is exactly chance, the same on every run.
    for probe in (["Values: " + render_numbers(it.values)[0] for it in items], [GENERIC_WORDS] * len(items),
                  [INJECTED_ANSWER] * len(items), [SELF_PRAISE] * len(items), [""] * len(items)):
        got, judgments = _accuracy(probe, items, pool, distractors)
        assert got == pytest.approx(1.0 / K)
        assert all(j.extra["scores"] == [0] * K for j in judgments)
    other, _ = _accuracy([other_text(honest, i) for i in range(len(items))], items, pool, distractors)
    assert other < acc - 0.4, (other, acc)


def test_s2c_names_the_items_own_caption(lineups):
    items, _pool, distractors = lineups
    caps = {it.id: describe_series(it.values) for it in items}
    judge = identification_judge(ClaimsVerifier(), IdentifyConfig(k=K, direction="s2c"))
    out = judge.judge([caps[it.id] for it in items],
                      {"series": [it.values.tolist() for it in items],
                       "distractor_captions": [[caps[d] for d in distractors[it.id][: K - 1]] for it in items]})
    assert np.mean([j.extra["hard"] for j in out]) >= 0.9


def test_training_verifier_stays_out_of_the_eval_mean(lineups, tmp_path):
    items, pool, distractors = lineups
    items = items[:12]
    systems = [CaptionSet("trained", {it.id: describe_series(it.values) for it in items}),
               CaptionSet("dump", {it.id: "Values: " + render_numbers(it.values)[0] for it in items})]
    # Two code verifiers that disagree (at a 10-sigma tolerance every candidate supports every value: more ties,
    # less accuracy), so a mean that included the training verifier would differ from the evaluation verifier's.
    verifiers = {"train-verifier": ClaimsVerifier(tolerance=10.0), "claims": ClaimsVerifier()}
    cfg = IdentifyEvalConfig(modes=["likelihood"], directions=["c2s"], ks=[K], verifiers=["claims:rules"])
    summary = run_identification(items, systems, distractors, pool, verifiers, cfg, tmp_path)
    ident = {r["system"]: r for r in summary.rows}
    assert ident["dump"]["transcription"] == pytest.approx(1.0) and ident["dump"]["run_frac"] == 1.0
    assert ident["trained"]["transcription"] < 0.3 and ident["trained"]["run_frac"] == 0.0
    assert "transcription" in (tmp_path / "table.md").read_text()
    checks = run_final_checks({s.name: s.captions for s in systems}, {it.id: it.values for it in items}, tmp_path,
                              identification=summary.summary())
    rows = {r["system"]: r for r in checks["rows"]}
    trained = rows["trained"]
    assert trained["c2s_eval_mean"] == trained["c2s[claims]"] >= 0.9
    assert trained["c2s[train]"] < trained["c2s[claims]"]
    assert rows["dump"]["c2s_eval_mean"] == pytest.approx(1.0 / K)
    assert not any("no evaluation verifier" in n for n in checks["notes"])
    assert "c2s[claims]" in (tmp_path / "final_checks.md").read_text()


def test_specs_are_validated_and_the_cpu_config_scores_with_claims():
    assert parse_claims_spec("claims:rules") == ClaimsVerifier()
    assert parse_claims_spec("claims:rules,tolerance=0.5").tolerance == 0.5
    with pytest.raises(ConfigError, match=r"eval\.verifiers\.x"):
        parse_claims_spec("claims:rules,tolrance=0.5", "eval.verifiers.x")
    with pytest.raises(ConfigError, match="claims:llm"):
        parse_claims_spec("claims:llm")
    assert IdentifyEvalConfig(verifiers=["claims:rules"]).verifiers == ["claims:rules"]
    with pytest.raises(ConfigError, match="verifiers"):
        IdentifyEvalConfig(verifiers=["claims:bogus"])

    from captionrl.train import lineup, lineup_config

    cfg = load_config(lineup.LineupConfig, ROOT / "configs" / "lineup-cpu.yaml")
    assert isinstance(lineup_config.eval_verifier(cfg.eval.verifiers["claims"], "eval.verifiers.claims"), ClaimsVerifier)
    assert [f for _, f in lineup.LineupRecipe(cfg).servers()] == ["verifier"]  # nothing to probe for claims
    with pytest.raises(ConfigError, match=r"eval\.verifiers\.bad"):
        load_config(lineup.LineupConfig, None, ["eval.verifiers.bad=claims:rules,x=1"])
