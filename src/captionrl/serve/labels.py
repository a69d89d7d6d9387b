"""Labels of the reward service, validated before anything is judged: a malformed label is HTTP 400.

An engine's dataset stores each item's judge columns as its label (OpenRLHF ``--data.label_key``, verl
``reward_model.ground_truth``). A label is a JSON object of columns, or the reward's main column alone
(``MAIN_COLUMN``), sent either as a JSON value or as a string holding JSON. A string that does not
parse is an error, never a bare reference: a label ``not json {`` once scored 0.0 with ``scored: true``.
Each reward's main column is checked for its type here, so the error names ``labels[i].<column>`` and
says what to send; the judges' own checks stay the backstop.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from captionrl.errors import DataError
from captionrl.serve.config import MAIN_COLUMN

EXAMPLES = {"identification": '{"candidates": [[true series], [distractor], ...]} '
                              "(captionrl.adapters.engine.encode_label)",
            "rubric": '{"rubric": [{"criterion": ..., "test": ..., "weight": 1|2|3}, ...]} or {"item_id": ...}',
            "judge": '{"reference": "a reference caption"}',
            "answerability": '{"questions": [{"question": ..., "options": [...], "answer": ...}], "id": ...}',
            "cider": '{"references": ["a reference caption", ...]}'}


def label_columns(label: Any, reward: str, i: int) -> dict[str, Any]:
    """The columns one label gives (``{}`` for no label); a string must hold JSON (``DataError`` otherwise)."""
    if label is None:
        return {}
    value = label
    if isinstance(label, (str, bytes)):
        text = label.decode() if isinstance(label, bytes) else label
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise DataError(f"labels[{i}]", text, f"is not valid JSON ({exc})",
                            f"store json.dumps of the item's columns as its label, e.g. {EXAMPLES[reward]}") from exc
    return dict(value) if isinstance(value, dict) else {MAIN_COLUMN[reward]: value}


def label_rows(labels: Sequence[Any], reward: str, *, needs_main: bool = True,
               columns: Mapping[str, Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """One row of judge columns per label (``label_columns``), with each of ``columns`` (a value per label)
    added, every row checked (``check_row``): what the reward service and the adapters judge."""
    rows = [label_columns(label, reward, i) for i, label in enumerate(labels)]
    for key, values in (columns or {}).items():
        for row, value in zip(rows, values, strict=True):
            row[key] = value
    for i, row in enumerate(rows):
        check_row(row, reward, i, needs_main=needs_main)
    return rows


def check_row(row: dict[str, Any], reward: str, i: int, *, needs_main: bool = True) -> None:
    """The reward's main column of item ``i`` is present (when ``needs_main``) and of the right type."""
    main = MAIN_COLUMN[reward]
    where = f"labels[{i}].{main}"
    if main in row:
        CHECKS[reward](row[main], where)
    elif needs_main and not (reward == "rubric" and "item_id" in row):
        raise DataError(where, sorted(row), f"is missing: the {reward} reward needs column {main!r}",
                        f"send {EXAMPLES[reward]} as each item's label")


def _number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v))


def _candidates(value: Any, where: str) -> None:
    if not isinstance(value, list) or len(value) < 2:
        raise DataError(where, value, "must be a list of at least 2 series (the true one first)",
                        f"send {EXAMPLES['identification']}")
    for k, series in enumerate(value):
        if not isinstance(series, list) or not series or not all(_number(v) for v in series):
            raise DataError(f"{where}[{k}]", series, "must be a non-empty list of finite numbers",
                            "send each candidate series as a list of numbers")


def _references(value: Any, where: str) -> None:
    refs = [value] if isinstance(value, str) else value
    if not isinstance(refs, list) or not refs or not all(isinstance(r, str) and r.strip() for r in refs):
        raise DataError(where, value, "must be a non-empty list of non-empty reference captions",
                        f"send {EXAMPLES['cider']}")


def _reference(value: Any, where: str) -> None:
    if not isinstance(value, str) or not value.strip():
        raise DataError(where, value, "must be a non-empty string", f"send {EXAMPLES['judge']}")


def _rubric(value: Any, where: str) -> None:
    from captionrl.judges.rubric import validate_rubric

    validate_rubric(value, field_name=where)


def _questions(value: Any, where: str) -> None:
    from captionrl.judges.qa import to_question

    if not isinstance(value, list) or not value:
        raise DataError(where, value, "must be a non-empty list of questions", f"send {EXAMPLES['answerability']}")
    for k, q in enumerate(value):
        to_question(q, where=f"{where}[{k}]")


CHECKS: dict[str, Callable[[Any, str], None]] = {"identification": _candidates, "cider": _references,
                                                 "judge": _reference, "rubric": _rubric, "answerability": _questions}
