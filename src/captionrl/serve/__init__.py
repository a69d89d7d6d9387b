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
``{"rubric": [...]}`` for a rubric, ``{"reference": ...}`` for the judge family), or the reward's main
column alone, as a JSON value or a string holding JSON. Any other top-level list as long as ``query`` is
a column too. Labels are checked before anything is judged (``serve.labels``): JSON that does not parse,
a wrong type or a missing column is HTTP 400 with ``{"error": {"field", "value", "problem", "fix"}}``.

Failures follow ``serve.failure``, decided from what OpenRLHF and verl do with a reward (neither masks
one; ``docs/engines.md`` cites their code): every reward in a reply is finite. A verifier outage is
re-judged until ``outage_deadline_s``, then the request is HTTP 503 (the engine's client retries; when it
gives up the run stops naming the cause). A caption the judge answered for but could not score gets
``unscored_reward`` (a value you choose for the engine), with ``scored: false``, ``extra_logs.unscored``
1 and its error, counted in ``/health``; with no value chosen the request is HTTP 422. Never NaN, never a
fabricated 0. CIDEr-D fits its document frequencies once, at start, on ``reward.cider.references`` (the
training references: a prepared folder or a reference file) and refuses to start without them.

Requests from all clients are pooled for ``batch_window_ms`` into one judge call (per-sample callers such
as OpenRLHF 0.11 and verl's reward loop then still fill the verifier's batches), at most
``max_concurrency`` judge calls run at once, and every request is recorded in ``records`` (JSONL).
``GET /health`` reports the queue, the counts (unscored, retries, outages, refused) and, for a
replicated openai verifier, each replica's state.

verl 0.9.1: ``reward.custom_reward_function.path=pkg://captionrl.serve.client``, ``name: compute_score_async``
(or ``compute_score``), the URL in ``+reward.custom_reward_function.reward_kwargs.url``. OpenRLHF 0.11:
``--reward.remote_url http://HOST:PORT/reward``. Launch lines for both: ``docs/engines.md``.
"""
