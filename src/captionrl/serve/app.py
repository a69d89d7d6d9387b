"""The reward service's Starlette app: request parsing, cross-client batching, bounded judge calls.

See ``captionrl.serve`` for the contract. ``create_app(cfg, judge)`` returns the ASGI app; uvicorn (or
any ASGI server) runs it.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
import threading
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from captionrl.backends.base import as_model_failure
from captionrl.errors import UserInputError
from captionrl.serve.config import RewardServiceConfig
from captionrl.serve.failure import UnscorableCaption, VerifierOutage, score_labels
from captionrl.serve.labels import label_rows
from captionrl.serve.text import strip_end
from captionrl.types import Judgment

RESERVED = ("query", "prompts", "labels")


class JSONReply(Response):
    """Strict JSON: a NaN or inf anywhere in a reply raises here (a bug) instead of reaching an engine
    that does not mask it (``serve.failure``)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return json.dumps(content, allow_nan=False, ensure_ascii=False, default=str).encode("utf-8")


def error_response(status: int, field: str, value: Any, problem: str, fix: str,
                   headers: dict[str, str] | None = None) -> JSONReply:
    finite = isinstance(value, (int, float, bool)) and math.isfinite(float(value))
    shown = value if finite or value is None else str(value)[:200]
    return JSONReply({"error": {"field": field, "value": shown, "problem": problem, "fix": fix}},
                     status_code=status, headers=headers)


@dataclass
class Job:
    """One request's captions and columns, waiting for a judge call."""

    captions: list[str]
    rows: list[dict[str, Any]]
    future: asyncio.Future[list[Judgment]]
    batch_id: int | None = None
    batch_size: int = 0


@dataclass
class Stats:
    requests: int = 0
    captions: int = 0
    unscored: int = 0
    """captions given ``unscored_reward`` (unscorable, flagged in the reply)"""
    retries: int = 0
    """re-judgings of captions an outage left unscored"""
    outages: int = 0
    """requests answered 503 (the verifier stayed down past the deadline)"""
    refused: int = 0
    """requests answered 422 (an unscorable caption and no ``unscored_reward``)"""
    batches: int = 0
    pending: int = 0
    running: int = 0
    started: float = field(default_factory=time.time)


def parse_request(data: Any, reward: str, *, needs_main: bool = True,
                  strip_suffixes: Sequence[str] = ()) -> tuple[list[str], list[dict[str, Any]]]:
    """(captions, per-caption columns) from an OpenRLHF body; ``UserInputError`` names what is wrong
    (labels are checked by ``serve.labels``: JSON that does not parse, a wrong type, a missing column)."""
    if not isinstance(data, dict):
        raise UserInputError("body", type(data).__name__, "must be a JSON object",
                             'send {"query": [...], "prompts": [...], "labels": [...]}')
    query = data.get("query")
    if not isinstance(query, list) or not query or not all(isinstance(q, str) for q in query):
        raise UserInputError("query", query, "must be a non-empty list of strings (prompt + response)",
                             'send "query": ["<prompt><response>", ...]')
    n = len(query)
    prompts = data.get("prompts")
    if prompts is None:
        prompts = [""] * n
    if not isinstance(prompts, list) or len(prompts) != n or not all(isinstance(p, str) for p in prompts):
        raise UserInputError("prompts", prompts if not isinstance(prompts, list) else f"{len(prompts)} items",
                             f"must be a list of {n} strings, one per query", "send the prompt of each query")
    labels = data.get("labels")
    if labels is not None and (not isinstance(labels, list) or len(labels) != n):
        raise UserInputError("labels", labels if not isinstance(labels, list) else f"{len(labels)} items",
                             f"must be a list of {n} labels, one per query",
                             "send one label per query (e.g. the JSON of the item's judge columns)")
    for i, (q, p) in enumerate(zip(query, prompts, strict=True)):
        if p and not q.startswith(p):  # judging the prompt as part of the caption would score the wrong text
            raise UserInputError(f"query[{i}]", q[:80], "does not start with its prompt (prompts[i])",
                                 "send query = prompt + response (OpenRLHF does), or the response alone with prompt ''")
    captions = [strip_end(q[len(p):], strip_suffixes) for q, p in zip(query, prompts, strict=True)]
    columns = {key: values for key, values in data.items() if key not in RESERVED}
    for key, values in columns.items():
        if not isinstance(values, list) or len(values) != n:
            raise UserInputError(key, values if not isinstance(values, list) else f"{len(values)} items",
                                 f"an extra field is a column: a list of {n} values, one per query",
                                 f"send {key!r} as a list aligned with query, or drop it")
    rows = label_rows(labels or [None] * n, reward, needs_main=needs_main, columns=columns)
    keys = {frozenset(r) for r in rows}
    if len(keys) > 1:
        raise UserInputError("labels", sorted(map(sorted, keys))[:3], "items of one request give different columns",
                             "give every item of a request the same label fields")
    return captions, rows


class Batcher:
    """Pools requests from all clients for a short window, then runs one judge call per column set."""

    def __init__(self, judge: Any, cfg: RewardServiceConfig) -> None:
        self.judge = judge
        self.cfg = cfg
        self.stats = Stats()
        self._queue: asyncio.Queue[Job] | None = None
        self._sem: asyncio.Semaphore | None = None
        self._worker: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self) -> None:
        self._queue = asyncio.Queue()
        self._sem = asyncio.Semaphore(self.cfg.max_concurrency)
        self._worker = asyncio.create_task(self._collect())

    async def stop(self) -> None:
        if self._worker is not None:
            self._worker.cancel()

    async def submit(self, captions: list[str], rows: list[dict[str, Any]]) -> Job:
        assert self._queue is not None, "Batcher.start() was not awaited"
        job = Job(captions, rows, asyncio.get_running_loop().create_future())
        self.stats.pending += len(captions)
        await self._queue.put(job)
        try:
            await job.future
        finally:
            self.stats.pending -= len(captions)
        return job

    async def _collect(self) -> None:
        assert self._queue is not None and self._sem is not None
        loop = asyncio.get_running_loop()
        window = self.cfg.batch_window_ms / 1000.0
        while True:
            jobs = [await self._queue.get()]
            size = len(jobs[0].captions)
            deadline = loop.time() + window
            while size < self.cfg.max_batch:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    break
                try:
                    job = await asyncio.wait_for(self._queue.get(), remaining)
                except TimeoutError:
                    break
                jobs.append(job)
                size += len(job.captions)
            await self._sem.acquire()
            task = asyncio.create_task(self._run(jobs))
            self._tasks.add(task)  # keep a reference until done (the loop holds only weak ones)
            task.add_done_callback(self._tasks.discard)

    async def _run(self, jobs: list[Job]) -> None:
        assert self._sem is not None
        batch_id = next(self._ids)
        self.stats.batches += 1
        self.stats.running += 1
        try:
            groups: dict[frozenset[str], list[Job]] = {}
            for job in jobs:
                job.batch_id, job.batch_size = batch_id, sum(len(j.captions) for j in jobs)
                groups.setdefault(frozenset(job.rows[0]), []).append(job)
            for group in groups.values():
                await self._judge_group(group)
        finally:
            self.stats.running -= 1
            self._sem.release()

    async def _judge_group(self, jobs: list[Job]) -> None:
        try:
            results = await self._call([c for j in jobs for c in j.captions], [r for j in jobs for r in j.rows])
        except UserInputError as exc:
            if len(jobs) > 1:  # one bad request must not fail the others pooled with it
                for job in jobs:
                    await self._judge_group([job])
            elif not jobs[0].future.done():
                jobs[0].future.set_exception(exc)  # becomes this request's HTTP 400
            return
        except Exception as exc:  # sorted below: a model failure or a bug
            failure = as_model_failure(exc)
            if failure is None:  # a bug (a shape error too): each pooled request gets HTTP 500 naming it
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                return
            # the verifier failed (out of memory, a dead engine): unscored, with the cause
            results = [Judgment(score=None, error=str(failure)) for j in jobs for _ in j.captions]
        start = 0
        for job in jobs:
            if not job.future.done():
                job.future.set_result(results[start:start + len(job.captions)])
            start += len(job.captions)

    async def _call(self, captions: list[str], rows: list[dict[str, Any]]) -> list[Judgment]:
        columns = {k: [r[k] for r in rows] for k in rows[0]} if rows else {}
        return await asyncio.to_thread(self.judge.judge, captions, columns)


class RecordLog:
    """Append-only per-request JSONL (thread-safe; one line per request)."""

    def __init__(self, path: str | Path | None) -> None:
        self.path = Path(path) if path else None
        self._lock = threading.Lock()
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, rec: dict[str, Any]) -> None:
        if self.path is None:
            return
        from captionrl.records import dumps

        line = dumps(rec) + "\n"
        with self._lock, self.path.open("a", encoding="utf-8") as f:
            f.write(line)


def judge_log_keys(judge: Any, family: str) -> tuple[str, ...]:
    """The numeric fields every reply logs (``extra_logs``, one fixed set): the reward's own; for a bare judge
    (a stand-in), its family's fields."""
    from captionrl.rewards.reward import FAMILY_FIELDS

    keys = getattr(judge, "log_keys", None)
    return tuple(keys()) if callable(keys) else FAMILY_FIELDS.get(family, ())


def create_app(cfg: RewardServiceConfig, judge: Any) -> Starlette:
    """The ASGI app serving ``judge`` under ``cfg`` (see ``captionrl.serve``)."""
    batcher = Batcher(judge, cfg)
    records = RecordLog(cfg.records)
    policy = cfg.failure_policy()
    needs_main = cfg.needs_main_column()
    log_keys = judge_log_keys(judge, cfg.family)
    backend = getattr(judge, "backend", None) or getattr(getattr(judge, "answerer", None), "backend", None)

    async def reward(request: Request) -> Response:
        t0 = time.perf_counter()
        received = time.time()
        try:
            data = await request.json()
        except ValueError as exc:
            return error_response(400, "body", None, f"is not valid JSON ({exc})",
                                  'send Content-Type: application/json with {"query": [...], ...}')
        try:
            captions, rows = parse_request(data, cfg.family, needs_main=needs_main, strip_suffixes=cfg.strip_suffixes)
        except UserInputError as exc:
            return error_response(400, exc.field, exc.value, exc.problem, exc.fix)
        if batcher.stats.pending + len(captions) > cfg.max_pending:
            return error_response(503, "max_pending", cfg.max_pending, "the service is at capacity",
                                  "retry shortly, or start it with a larger max_pending / more replicas")
        jobs: list[Job] = []

        async def judge_subset(indices: list[int]) -> list[Judgment]:
            job = await batcher.submit([captions[i] for i in indices], [rows[i] for i in indices])
            jobs.append(job)
            return job.future.result()

        try:
            scored_labels = await score_labels(judge_subset, len(captions), policy, log_keys)
        except UserInputError as exc:
            return error_response(400, f"labels.{exc.field}", exc.value, exc.problem, exc.fix)
        except (VerifierOutage, UnscorableCaption) as exc:
            outage = isinstance(exc, VerifierOutage)
            batcher.stats.outages += int(outage)
            batcher.stats.refused += int(not outage)
            records.write({"received": received, "client": request.client.host if request.client else None,
                           "n": len(captions), "status": 503 if outage else 422, "error": str(exc),
                           "captions": captions, "columns": sorted(rows[0])})
            if outage:
                return error_response(503, "verifier", exc.error, str(exc), "the engine's client retries a 503; "
                                      "restart the verifier or add replicas, or raise outage_deadline_s",
                                      headers={"Retry-After": str(max(1, round(policy.retry_interval_s)))})
            return error_response(422, "unscored_reward", None, str(exc),
                                  f"start the service with unscored_reward=<value> (see captionrl serve reward "
                                  f"--help); the caption's error: {exc.error}")
        except Exception as exc:  # a bug in the judge: say so (HTTP 500), do not score the batch as unscored
            return error_response(500, "judge", cfg.family, f"raised {type(exc).__name__}: {exc}",
                                  "this is a bug in captionrl: report it with the service's records")
        settled, retries, extra = scored_labels.settled, scored_labels.retries, scored_labels.logs
        rewards = [s.reward for s in settled]
        scored = [s.scored for s in settled]
        errors = [s.error for s in settled]
        batcher.stats.requests += 1
        batcher.stats.captions += len(captions)
        batcher.stats.unscored += scored.count(False)
        batcher.stats.retries += retries
        latency = time.perf_counter() - t0
        records.write({"received": received, "client": request.client.host if request.client else None,
                       "n": len(captions), "status": 200, "batch_id": jobs[0].batch_id,
                       "batch_size": jobs[0].batch_size, "retries": retries, "latency_s": round(latency, 4),
                       "rewards": rewards, "scored": scored, "errors": errors, "captions": captions,
                       "columns": sorted(rows[0])})
        return JSONReply({"rewards": rewards, "scores": list(rewards), "extra_logs": extra,
                          "scored": scored, "errors": errors})

    async def health(request: Request) -> Response:
        s = batcher.stats
        body: dict[str, Any] = {"status": "ok", "reward": cfg.family, "judge": getattr(judge, "name", None),
                                "backend": getattr(backend, "name", None), "requests": s.requests,
                                "captions": s.captions, "unscored": s.unscored, "retries": s.retries,
                                "outages": s.outages, "refused": s.refused, "batches": s.batches,
                                "pending": s.pending, "running": s.running,
                                "uptime_s": round(time.time() - s.started, 1)}
        status = getattr(backend, "replica_status", None)
        if callable(status):
            body["replicas"] = status()
        return JSONReply(body)

    @asynccontextmanager
    async def lifespan(_app: Starlette) -> AsyncIterator[None]:
        await batcher.start()
        try:
            yield
        finally:
            await batcher.stop()

    app = Starlette(
        routes=[Route("/reward", reward, methods=["POST"]), Route("/get_reward", reward, methods=["POST"]),
                Route("/health", health, methods=["GET"])],
        lifespan=lifespan,
    )
    app.state.batcher = batcher
    return app
