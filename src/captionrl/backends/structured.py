"""Schema-constrained decoding for in-process transformers models (xgrammar).

A role that must answer in JSON (rubric writer, Judge, Generator) puts its schema on the request
(``ChatRequest.json_schema``). Servers are asked for guided decoding through ``response_format``
(vLLM, llama.cpp); in process, ``backends.hf`` hands ``transformers``' ``generate`` the logits processor
built here, which masks every token that would leave the schema, so the reply is schema-valid JSON
whenever it finishes within its token budget (a budget cut leaves it unfinished: its reader rejects it).

Why xgrammar: it compiles a JSON schema once into a token-level automaton (a bitmask per step costs
microseconds on CPU), it is the engine vLLM uses for the same schemas, and its matcher plugs into
``generate`` as a plain ``LogitsProcessor``. Grammars are compiled with ``any_whitespace=False``: with
free whitespace a weak (or random) model spends its whole budget on blanks between tokens.

Caches: one ``GrammarCompiler`` per tokenizer object (held weakly) and one compiled grammar per (tokenizer,
schema), so the G judge requests of a group and every later step reuse the same automaton.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Mapping, Sequence
from typing import Any

from captionrl.errors import BackendError

INSTALL_HINT = "pip install xgrammar (a captionrl dependency: bash scripts/setup.sh installs it)"


def require_xgrammar() -> None:
    """Raise ``BackendError`` with the install fix when xgrammar is missing."""
    _xgr()


def _xgr() -> Any:
    """The xgrammar module; a missing install raises (it is not a model failure: no reply is unscored for it)."""
    try:
        import xgrammar
    except ImportError as exc:
        raise BackendError(f"backend.constrain=True: decoding under a JSON schema needs the xgrammar package "
                           f"({exc}). Fix: {INSTALL_HINT}, or set constrain=false to decode unconstrained") from None
    return xgrammar


def schema_key(schema: Mapping[str, Any]) -> str:
    """The compact text of ``schema``: the grammar cache key. Keys keep their order, because the grammar
    emits properties in the schema's order (a Judge writes its reason before its decision)."""
    return json.dumps(schema, separators=(",", ":"))


class GrammarCache:
    """Compiled grammars of one tokenizer, keyed by schema (``schema_key``)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        xgr = _xgr()
        info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size)
        self.vocab_size = vocab_size
        self.stop_token_ids = list(info.stop_token_ids)
        self._compiler = xgr.GrammarCompiler(info)
        self._grammars: dict[str, Any] = {}
        self.compiled = 0
        """How many distinct schemas were compiled (the rest were cache hits)."""

    def grammar(self, schema: Mapping[str, Any]) -> Any:
        key = schema_key(schema)
        got = self._grammars.get(key)
        if got is None:
            got = self._compiler.compile_json_schema(key, any_whitespace=False)
            self._grammars[key] = got
            self.compiled += 1
        return got


_CACHES: weakref.WeakKeyDictionary[Any, GrammarCache] = weakref.WeakKeyDictionary()


def grammar_cache(tokenizer: Any, vocab_size: int) -> GrammarCache:
    """The one ``GrammarCache`` of ``tokenizer`` (shared by every backend wrapping it)."""
    cache = _CACHES.get(tokenizer)
    if cache is None or cache.vocab_size != vocab_size:
        cache = GrammarCache(tokenizer, vocab_size)
        _CACHES[tokenizer] = cache
    return cache


def model_vocab_size(model: Any) -> int:
    """Width of the model's logits (may exceed the tokenizer's vocabulary: padded embedding rows)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None:
        return int(weight.shape[0])
    return int(model.config.get_text_config().vocab_size)


class SchemaLogitsProcessor:
    """A ``transformers`` logits processor masking each batch row to its own schema (``None``: free).

    One instance serves one ``generate`` call (its matchers hold the rows' parse states). A row whose JSON
    is complete may only emit a stop token, so it ends there even when ``generate`` stops on another id.
    """

    def __init__(self, grammars: Sequence[Any | None], stop_token_ids: Sequence[int]) -> None:
        xgr = _xgr()
        self._xgr = xgr
        self.matchers = [None if g is None else xgr.GrammarMatcher(g) for g in grammars]
        self.stop_token_ids = list(stop_token_ids)
        self.bitmask: Any = None
        self.started = False

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if input_ids.shape[0] != len(self.matchers):
            raise RuntimeError(f"schema processor built for {len(self.matchers)} rows, got {input_ids.shape[0]}")
        if self.bitmask is None:
            self.bitmask = self._xgr.allocate_token_bitmask(len(self.matchers), scores.shape[-1])
        rows = []
        for i, m in enumerate(self.matchers):
            if m is None:
                continue
            if self.started and not m.is_terminated():
                token = int(input_ids[i, -1])
                if not m.accept_token(token):
                    raise RuntimeError(f"row {i}: the grammar rejected token {token}, which its own mask allowed")
            if m.is_terminated():  # the JSON is complete: only a stop token may follow
                scores[i] = torch.where(self._stop_mask(scores), scores[i], torch.full_like(scores[i], -float("inf")))
                continue
            m.fill_next_token_bitmask(self.bitmask, i)
            rows.append(i)
        self.started = True
        if rows:  # rows without a schema (or already complete) are left as they are
            self._xgr.apply_token_bitmask_inplace(scores, self.bitmask.to(scores.device), indices=rows)
        return scores

    def _stop_mask(self, scores: Any) -> Any:
        import torch

        mask = torch.zeros(scores.shape[-1], dtype=torch.bool, device=scores.device)
        mask[[t for t in self.stop_token_ids if t < scores.shape[-1]]] = True
        return mask


def schema_processor(tokenizer: Any, model: Any, schemas: Sequence[Mapping[str, Any] | None]) -> SchemaLogitsProcessor:
    """The processor constraining each row to its schema (``None``: that row decodes freely)."""
    cache = grammar_cache(tokenizer, model_vocab_size(model))
    return SchemaLogitsProcessor([None if s is None else cache.grammar(s) for s in schemas], cache.stop_token_ids)
