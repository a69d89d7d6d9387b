"""Pinned lineups: distractors share the true window's start, end and trend, so only the middle tells."""

from __future__ import annotations

import numpy as np

from captionrl.domains.describe import describe_series, short_description
from captionrl.domains.lineup_data import LineupDataConfig, build_lineup_data
from captionrl.domains.pinned import endpoint_line, pin_endpoints
from captionrl.judges.claims_verifier import parse_claims_spec
from captionrl.judges.identification import IdentifyConfig
from captionrl.types import Series


def test_a_pinned_distractor_keeps_its_shape_on_the_items_endpoints_and_wiggle():
    item = Series(id="x", values=np.array([10.0, 14.0, 11.0, 12.5, 16.0, 13.0, 15.0, 20.004]))
    other = Series(id="d", values=np.array([5.0, 4.0, 9.0, 3.0, 2.0, 8.0, 1.0, 0.0]), split="train", domain="z")
    pinned = pin_endpoints(item, other, precision=2)
    v = pinned.values
    assert v[0] == 10.0 and v[-1] == 20.0  # the printed start and end of the item
    rx, rd, rp = (s - endpoint_line(s) for s in (item.values, other.values, v))
    assert abs(rp.std() - rx.std()) < 0.01  # as much wiggle as the item
    assert np.corrcoef(rp, rd)[0, 1] > 0.999  # the distractor's own shape
    assert pinned.id == "d~x" and pinned.split == "train" and pinned.meta == {"pinned_to": "x", "shape_of": "d"}


def test_pinned_lineups_leave_endpoints_uninformative_and_pay_for_the_middle():
    """Under the code-checked verifier, a caption naming only the direction, start and end identifies the window
    at chance in pinned lineups (well above it in plain ones), while the describer's caption, which names the
    extrema and where they fall, still does."""
    cfg = dict(window=16, n_train=48, n_test=0, n_val=0, balance="direction")
    judge = parse_claims_spec("claims:rules").identification_judge(IdentifyConfig(k=4))

    def accuracy(data, caption) -> float:
        rows = data.rows["train"]
        got = judge.judge([caption(np.asarray(r["series"])) for r in rows], {"candidates": [r["candidates"] for r in rows]})
        return float(np.mean([j.score for j in got]))

    plain = build_lineup_data(LineupDataConfig(**cfg), 4, seed=0)
    pinned = build_lineup_data(LineupDataConfig(**cfg, pin_endpoints=True), 4, seed=0)
    for r in pinned.rows["train"]:
        c = np.asarray(r["candidates"])
        assert (np.round(c[:, 0], 2) == round(c[0, 0], 2)).all() and (np.round(c[:, -1], 2) == round(c[0, -1], 2)).all()
        assert all(cid in pinned.pool for cid in r["candidate_ids"])
    endpoints = lambda v: short_description(v)  # noqa: E731
    assert accuracy(plain, endpoints) > 0.6
    assert accuracy(pinned, endpoints) < 0.35
    assert accuracy(pinned, describe_series) > 0.6
