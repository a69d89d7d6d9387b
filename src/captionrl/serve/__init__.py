"""The project's rewards over HTTP, for trainers that are not TRL (OpenRLHF, verl, anything that POSTs).

``captionrl serve reward --config FILE`` starts a Starlette app under uvicorn (``pip install
'captionrl[serve]'``). It speaks OpenRLHF's remote reward contract::

    POST /reward   (also /get_reward, OpenRLHF's example path)
    {"query": [prompt+response, ...], "prompts": [prompt, ...], "labels": [label, ...], <column>: [...]}
    -> {"rewards": [...], "scores": [...], "extra_logs": {"hard": [...], "unscored": [...], ...},
        "scored": [true, ...], "errors": [null, ...]}

The caption is the query with its prompt prefix removed. A label is the item's judge columns: a JSON
object (``{"candidates": [[true series], [distractor], ...]}`` for identification,
``{"references": [...]}`` for CIDEr-D, ``{"questions": [...], "id": ...}`` for answerability,
``{"rubric": [...]}`` for a rubric, ``{"reference": ...}`` for the scalar judge), or a bare value taken
as the reward's main column. Any other top-level list as long as ``query`` is a column too.

A caption the judge could not score (verifier down, unparseable reply) gets NaN (``failure_value: nan``,
the default; OpenRLHF and verl mask non-finite rewards) or ``null``, with ``scored: false`` and the
error: never 0, which the policy would learn from. A malformed request gets HTTP 400 with
``{"error": {"field", "value", "problem", "fix"}}``.

Requests from all clients are pooled for ``batch_window_ms`` into one judge call (per-sample callers such
as verl's reward loop then still fill the verifier's batches), at most ``max_concurrency`` judge calls run
at once, and every request is recorded in ``records`` (JSONL). ``GET /health`` reports the queue and,
for a replicated openai verifier, each replica's state.

verl: point ``custom_reward_function.path`` at ``captionrl/serve/client.py`` (``name: compute_score``, or
``compute_score_async`` for verl's async reward loop) and set ``CAPTIONRL_REWARD_URL=http://HOST:PORT``::

    CAPTIONRL_REWARD_URL=http://10.0.0.5:8000 python -m verl.trainer.main_ppo \\
        custom_reward_function.path=$(python -c "import captionrl.serve.client as c; print(c.__file__)") \\
        custom_reward_function.name=compute_score_async ...

OpenRLHF: ``--remote_rm_url http://HOST:PORT/reward`` (each label from
``captionrl.adapters.engine.encode_label`` for identification).
"""
