"""Bad input, end to end: every command that reads files or servers, given a broken
input, ends with a one-line named error (exit 2, field/file/line, value and fix on stderr, no traceback)
before any model loads; where the input is usable it ends with a result.

Each case runs ``captionrl.cli.main`` in-process. Model loading is made impossible for the whole module
(``transformers`` ``from_pretrained``, the policy loader and the HF backend raise ``ModelLoaded``, a
``BaseException`` no ``except Exception`` can swallow), so a case that reaches a model fails loudly, and
every case must finish within ``FAST_S`` seconds.
"""

from __future__ import annotations

import json
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from captionrl.cli import main

FAST_S = 5.0  # every case takes ~0.1-1.2 s once imports are warm; a model load or a retry loop takes far longer


class ModelLoaded(BaseException):
    """Raised by every model loader in this module: a bad input must fail before any model loads."""


@pytest.fixture(scope="module", autouse=True)
def warm_imports() -> None:
    """Import TRL once up front: the training commands build their trainer arguments (which imports TRL,
    5-25 s cold on a busy 2-core machine) before they read the data, and the time limit is about model
    loads and retry loops, not about a one-time import."""
    from trl import GRPOConfig, RLOOConfig  # noqa: F401  (TRL's module is lazy: name the configs)


@pytest.fixture(autouse=True)
def no_models(monkeypatch: pytest.MonkeyPatch) -> None:
    import transformers

    import captionrl.backends.hf as hf
    import captionrl.encoders as encoders
    import captionrl.train.run.loading as loading

    def refuse(*args: object, **kwargs: object) -> None:
        raise ModelLoaded(f"a model was loaded: {args[:1]}")

    for name in ("AutoModel", "AutoModelForCausalLM", "AutoModelForImageTextToText"):
        monkeypatch.setattr(getattr(transformers, name), "from_pretrained", refuse)
    monkeypatch.setattr(loading, "load_policy", refuse)
    monkeypatch.setattr(hf.HFBackend, "__init__", refuse)
    monkeypatch.setattr(encoders.TextEncoder, "_load", refuse)


def closed_port() -> int:
    """A local port nothing listens on (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


DEAD = f"openai:http://127.0.0.1:{closed_port()}/v1#m"
URL = re.escape(DEAD.split("#")[0].removeprefix("openai:"))


# ---------------------------------------------------------------------- the bad files
SERIES = [[float(v) for v in range(i, i + 8)] for i in range(6)]
NEXT = [[float(v) for v in range(i + 8, i + 12)] for i in range(6)]


def series_line(i: int, **over: object) -> str:
    rec: dict[str, object] = {"id": f"it{i}", "series": SERIES[i] if i % 2 else SERIES[i][::-1],
                              "caption": f"A line that moves by one each step, item {i}.", "next": NEXT[i]}
    rec.update(over)
    return json.dumps({k: v for k, v in rec.items() if v is not None})


def caption_line(i: int, **over: object) -> str:
    rec: dict[str, object] = {"id": f"it{i}", "caption": f"A red circle, item {i}.",
                              "references": [f"A red circle, item {i}."], "reference": f"A red circle, item {i}."}
    rec.update(over)
    return json.dumps({k: v for k, v in rec.items() if v is not None})


def good_lines(fmt: str) -> list[str]:
    make = series_line if fmt == "series" else caption_line
    return [make(i) for i in range(6)]


def write_lines(p: Path, lines: list[str], kind: str, bad: tuple[bytes, bytes], cut: int) -> Path:
    """Write ``lines`` to ``p`` broken the ways every input file shares: ``missing`` (not written), ``empty``,
    ``nonutf8`` (line 2's ``bad[0]`` bytes become ``bad[1]``), ``malformed`` (line 3 cut to ``cut``
    characters, between good lines); any other kind is an edit the caller already made to ``lines``."""
    if kind == "missing":
        return p
    if kind == "empty":
        p.write_text("")
        return p
    data = [line.encode() for line in lines]
    if kind == "nonutf8":
        data[1] = data[1].replace(*bad)
        assert bad[1] in data[1], "the undecodable byte must land on line 2"
    elif kind == "malformed":
        data[2] = data[2][:cut]
    p.write_bytes(b"\n".join(data) + b"\n")
    return p


def bad_file(tmp: Path, kind: str, fmt: str, name: str = "caps.jsonl") -> Path:
    """A file of format ``fmt`` (series: {id, series, caption, next}; caption: {id, caption, ...}) broken by ``kind``.

    The broken line is line 2 (line 3 for a malformed line, which sits between good lines)."""
    p = tmp / name
    lines = good_lines(fmt)
    make = series_line if fmt == "series" else caption_line
    if kind == "nan":
        lines[1] = lines[1].replace(json.dumps(SERIES[1])[1:-1], json.dumps(SERIES[1])[1:-1].replace("2.0", "NaN"), 1)
        assert "NaN" in lines[1]
    elif kind == "mixed":
        lines[1] = make(1, series=SERIES[1][:5])
    elif kind == "dup":
        lines[1] = make(0, caption="A second caption of the first item.")
    elif kind == "nofield":
        lines[1] = make(1, caption=None)
    elif kind == "number":  # a caption that holds a number is not text
        lines[1] = make(1, caption=3.5)
    elif kind == "idlist":  # an id that is neither text nor an integer
        lines[1] = make(1, id=["it1", "x"])
    elif kind not in ("good", "missing", "empty", "nonutf8", "malformed"):
        raise ValueError(kind)
    return write_lines(p, lines, kind, (b"item 1.", b"caf\xe9 1."), cut=25)


# ---------------------------------------------------------------------- the matrix
@dataclass
class Case:
    """One command line and what it must end with."""

    id: str
    argv: Callable[[Path], list[str]]
    must: list[str] = field(default_factory=list)  # regexes stderr must match (case-insensitive)
    code: int = 2
    marks: tuple = ()
    check: Callable[[Path], None] | None = None  # for usable input (code 0): what the result must hold


def where(line: int, item: str | None = None) -> str:
    """The broken line named by number (``caps.jsonl:3``, ``caps.jsonl:line 3``) or by its item id."""
    alts = [rf"caps\.jsonl:(line )?{line}\b"]
    if item:
        alts.append(re.escape(item))
    return "(" + "|".join(alts) + ")"


FILE_KINDS = {
    # kind -> regexes stderr must contain (besides the file name)
    "missing": [r"caps\.jsonl", r"(not found|exist)"],
    "empty": [r"caps\.jsonl", r"(empty|no )"],
    "malformed": [where(3), r"json"],
    "nonutf8": [where(2), r"utf-?8"],
    "nan": [where(2, "it1"), r"nan"],
    "mixed": [where(2, "it1"), r"length"],
    "dup": [r"caps\.jsonl", r"it0", r"(twice|repeat|duplicate)"],
    "nofield": [where(2, "it1"), r"caption"],
    "number": [where(2, "it1"), r"caption", r"3\.5", r"(text|string)"],
    "idlist": [where(2, "it1"), r"\bid\b", r"(text|string)"],
}


def file_cases(cmd: str, fmt: str, argv: Callable[[Path, Path], list[str]], kinds: list[str]) -> list[Case]:
    """The bad-file cases of one command."""
    out = []
    for kind in kinds:
        def make(tmp: Path, kind: str = kind) -> list[str]:
            return argv(tmp, bad_file(tmp, kind, fmt))
        out.append(Case(f"{cmd}-{kind}", make, FILE_KINDS[kind]))
    return out


ALL = ["missing", "empty", "malformed", "nonutf8", "nan", "mixed", "dup", "nofield", "number", "idlist"]
CAPTION_KINDS = ["missing", "empty", "malformed", "nonutf8", "dup", "nofield", "number", "idlist"]  # no series in these files


def good(tmp: Path, fmt: str, name: str = "good.jsonl") -> Path:
    p = tmp / name
    p.write_text("\n".join(good_lines(fmt)) + "\n")
    return p


def long_corpus(tmp: Path) -> Path:
    """Three series of 40 values: a few dozen windows of length 4."""
    p = tmp / "long.jsonl"
    p.write_text("\n".join(json.dumps({"id": f"s{i}", "series": [float((v * (i + 2)) % 7) for v in range(40)]})
                           for i in range(3)) + "\n")
    return p


def out(tmp: Path, name: str = "out") -> str:
    """The ``out=DIR`` word; it goes before list flags, which would take it as one more of their values."""
    return f"out={tmp / name}"


def taken(tmp: Path) -> Path:
    """An existing file where a command makes its output folder."""
    p = tmp / "taken.txt"
    p.write_text("not a folder\n")
    return p


TAKEN = [r"taken\.txt", r"is a file where a folder is expected", r"folder"]


def lineup(tmp: Path, *words: str) -> list[str]:
    return ["train", "lineup", f"train.out_dir={tmp / 'run'}", "train.max_steps=1", *words]


def candidates_file(tmp: Path, kind: str) -> Path:
    """A LineupRL candidates file in ``captionrl candidates``' format (4 items of 8 values, each lined up
    with the 3 others, K=4), broken by ``kind``."""
    p = tmp / "caps.jsonl"
    ids = [f"it{i}" for i in range(4)]

    def rec(i: int, **over: object) -> str:
        r: dict[str, object] = {"key": ids[i], "item_id": ids[i], "distractor_ids": [d for d in ids if d != ids[i]],
                                "rule": "nearest", "seed": 0, "stats": ["mean"], "max_overlap": 0.0,
                                "split": "train", "series": [float(v * (i + 1)) for v in range(8)]}
        r.update(over)
        return json.dumps({k: v for k, v in r.items() if v is not None})

    lines = [rec(i) for i in range(4)]
    if kind == "nan":
        lines[1] = rec(1, series=[1.0, float("nan"), *[2.0] * 6])
    elif kind == "mixed":
        lines[1] = rec(1, series=[1.0, 2.0, 3.0, 4.0, 5.0])
    elif kind == "dup":
        lines[1] = lines[0]
    elif kind == "nofield":
        lines[1] = rec(1, series=None)
    elif kind == "small":  # fewer candidates than K
        lines[1] = rec(1, distractor_ids=["it0"])
    return write_lines(p, lines, kind, (b'"nearest"', b'"n\xe9arest"'), cut=20)


CANDIDATE_MUST = {**FILE_KINDS, "nofield": [where(2, "it1"), r"series"], "small": [where(2, "it1"), r"\bk\b"]}


def lineup_file_cases() -> list[Case]:
    out_ = []
    for kind in [*(k for k in ALL if k not in ("number", "idlist")), "small"]:  # no caption or id field there
        def make(tmp: Path, kind: str = kind) -> list[str]:
            return lineup(tmp, f"data.candidates_file={candidates_file(tmp, kind)}", "data.window=8")
        out_.append(Case(f"lineup-candidates-{kind}", make, CANDIDATE_MUST[kind]))
    return out_


def manifest(tmp: Path, kind: str) -> Path:
    """A rubric-build image manifest ({id, image, caption}) of real PNG files, broken by ``kind``."""
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 30, 30)).save(tmp / "red.png")
    lines = [json.dumps({"id": f"it{i}", "image": "red.png", "caption": f"A red square, item {i}."}) for i in range(4)]
    if kind == "dup":
        lines[1] = lines[0]
    return write_lines(tmp / "caps.jsonl", lines, kind, (b"item 1.", b"caf\xe9 1."), cut=25)


def labels(tmp: Path, kind: str, key: str = "label") -> Path:
    """Agreement input: {id, label} (human) or {id, decision} (judge) lines, broken by ``kind``."""
    p = tmp / ("caps.jsonl" if key == "label" else "judge.jsonl")
    lines = [json.dumps({"id": f"it{i}", key: "AB"[i % 2]}) for i in range(6)]
    if kind == "dup":
        lines[1] = json.dumps({"id": "it0", key: "B"})
    return write_lines(p, lines, kind, (b'"it1"', b'"caf\xe9"'), cut=10)


def summary_dir(tmp: Path, text: str) -> Path:
    d = tmp / "run"
    d.mkdir()
    (d / "summary.json").write_text(text)
    return d


CASES: list[Case] = [
    # ---- eval identify: {id, series, caption} files (read by the strict corpus loader)
    *file_cases("identify", "series", lambda t, f: ["eval", "identify", out(t), "--captions", str(f)], ALL),
    Case("identify-k-above-pool", lambda t: ["eval", "identify", out(t), "--captions", str(good(t, "series")), "--k", "50"],
         [r"\b50\b", r"(pool|candidates|distractor)"]),
    Case("identify-unknown-backend", lambda t: ["eval", "identify", out(t), "--verifier", "nosuch:model"],
         [r"nosuch", r"verifiers"]),
    Case("identify-unreachable", lambda t: ["eval", "identify", out(t), "--captions", str(good(t, "series")),
                                            "--verifier", DEAD], [URL, r"answer"]),
    # ---- eval bottleneck: {id, series, caption, next}
    *file_cases("bottleneck", "series", lambda t, f: ["eval", "bottleneck", out(t), "--captions", str(f), "--quiet"],
                ALL),
    # ---- eval entail: {id, caption, references}
    *file_cases("entail", "caption", lambda t, f: ["eval", "entail", out(t), "--captions", str(f), "--quiet"],
                CAPTION_KINDS),
    Case("entail-unknown-backend", lambda t: ["eval", "entail", out(t), "--captions", str(good(t, "caption")),
                                              "--backend", "nosuch:model"], [r"nosuch", r"backend"]),
    Case("entail-unreachable", lambda t: ["eval", "entail", out(t), "--captions", str(good(t, "caption")), "--backend", DEAD,
                                          "--quiet"], [URL, r"answer"]),
    # ---- eval spans: {id, series, caption}; mixed lengths are usable (each caption has its own series)
    *file_cases("spans", "series", lambda t, f: ["eval", "spans", out(t), "--captions", str(f), "--quiet"],
                [k for k in ALL if k != "mixed"]),
    Case("spans-mixed-usable", lambda t: ["eval", "spans", out(t), "--captions", str(bad_file(t, "mixed", "series")),
                                          "--quiet"], [], code=0, check=lambda t: _scored(t, "caps", 6)),
    Case("spans-conflicting-series", lambda t: ["eval", "spans", out(t), "--captions", str(good(t, "series")),
                                                str(bad_file(t, "mixed", "series")), "--quiet"],
         [where(2, "it1"), r"differs"]),
    # ---- eval pairwise: two systems, the second broken
    *file_cases("pairwise", "caption", lambda t, f: ["eval", "pairwise", out(t), "--captions", str(good(t, "caption")), str(f)],
                CAPTION_KINDS),
    Case("pairwise-unknown-backend", lambda t: ["eval", "pairwise", out(t), "--judge", "nosuch:model"], [r"nosuch", r"judge"]),
    Case("pairwise-unreachable", lambda t: ["eval", "pairwise", out(t), "--captions", str(good(t, "caption")),
                                            str(good(t, "caption", "good2.jsonl")), "--judge", DEAD],
         [URL, r"answer"]),
    # ---- eval qa: caption files and question files
    *file_cases("qa", "caption", lambda t, f: ["eval", "qa", out(t), "--captions", str(f)], CAPTION_KINDS),
    Case("qa-questions-missing", lambda t: ["eval", "qa", out(t), "--qa", f"bench={t / 'caps.jsonl'}"],
         [r"caps\.jsonl", r"not found"]),
    Case("qa-questions-id-list", lambda t: ["eval", "qa", out(t), "--captions", str(good(t, "caption")),
                                            "--qa", f"bench={_questions(t, [{'id': ['it0'], 'question': 'Colour?', 'answers': ['red']}])}"],
         [r"questions\.jsonl:line 1\.id", r"it0", r"(text|string)"]),
    Case("qa-unreachable", lambda t: ["eval", "qa", out(t), "--answerer", DEAD], [URL, r"answer"]),
    # ---- eval agreement: human labels {id, label}, judge decisions {id, decision}
    *[Case(f"agreement-{kind}", lambda t, kind=kind: ["eval", "agreement", out(t), f"labels={labels(t, kind)}",
                                                      "--judges", f"j={labels(t, 'good', 'decision')}"],
           FILE_KINDS[kind])
      for kind in ("missing", "empty", "malformed", "nonutf8", "dup")],
    Case("agreement-unreachable", lambda t: ["eval", "agreement", out(t), f"judge={DEAD}"],
         [URL, r"answer"]),
    # ---- caption: a corpus file, captioned by the describer (no model)
    *file_cases("caption", "series", lambda t, f: ["caption", f"out={t / 'c.jsonl'}", f"corpus={f}", "captioner=describer",
                                                   "length=4"], ["missing", "empty", "malformed", "nonutf8", "nan", "dup"]),
    Case("caption-unknown-backend", lambda t: ["caption", f"out={t / 'c.jsonl'}", "captioner=nosuch:model"],
         [r"nosuch", r"captioner"]),
    Case("caption-unreachable", lambda t: ["caption", f"out={t / 'c.jsonl'}", f"captioner={DEAD}", "limit=2"],
         [URL, r"answer"]),
    # ---- candidates: a corpus file
    *file_cases("candidates", "series", lambda t, f: ["candidates", "--corpus", str(f), "--out", str(t / "out"),
                                                      "--length", "4", "--quiet"],
                ["missing", "empty", "malformed", "nonutf8", "nan", "dup"]),
    Case("candidates-k-above-pool", lambda t: ["candidates", "--corpus", str(long_corpus(t)), "--out", str(t / "out"),
                                               "--length", "4", "--k", "50", "--quiet"], [r"\b50\b", r"(pool|windows)"]),
    # ---- eval configs: typos, wrong types (scalars and list items), values out of range
    Case("entail-config-typo", lambda t: ["eval", "entail", out(t), "tresh=0.5"], [r"tresh", r"threshold"]),
    Case("entail-config-type", lambda t: ["eval", "entail", out(t), "threshold=high"], [r"threshold", r"high", r"float"]),
    Case("identify-config-list-item", lambda t: ["eval", "identify", out(t), "ks=[4, four]"], [r"ks\[1\]", r"four", r"int"]),
    Case("identify-yaml-type", lambda t: ["eval", "identify", "--config", str(_yaml(t, "ks: [4]\nseed: first\n")), out(t)],
         [r"seed", r"first", r"int"]),
    Case("bottleneck-config-list-scalar", lambda t: ["eval", "bottleneck", out(t), "seeds=abc"], [r"seeds\[0\]", r"abc"]),
    Case("pairwise-config-range", lambda t: ["eval", "pairwise", out(t), "batch=0"], [r"batch", r"\b0\b"]),
    Case("qa-config-range", lambda t: ["eval", "qa", out(t), "batch=0"], [r"batch", r"\b0\b"]),
    # ---- train lineup: everything must fail before the policy loads
    Case("lineup-config-typo", lambda t: lineup(t, "train.max_stepz=3"), [r"max_stepz", r"max_steps"]),
    Case("lineup-config-type", lambda t: lineup(t, "train.max_steps=lots"), [r"max_steps", r"lots", r"int"]),
    Case("lineup-yaml-typo", lambda t: ["train", "lineup", "--config", str(_yaml(t, "reward:\n  kk: 4\n"))],
         [r"reward\.kk", r"\bk\b"]),
    Case("lineup-unknown-backend", lambda t: lineup(t, "verifier.kind=nosuch"), [r"nosuch", r"kind"]),
    Case("lineup-unreachable", lambda t: lineup(t, "verifier.kind=openai",
                                                f"verifier.base_url={DEAD.split('#')[0][7:]}"),
         [URL, r"answer"]),
    Case("lineup-k-above-pool", lambda t: lineup(t, "reward.k=20", "data.series=[nile]", "data.window=8"), [r"\b20\b", r"(windows|pool)"]),
    *lineup_file_cases(),
    # ---- train rubicap / moco: config typos and types
    Case("rubicap-config-typo", lambda t: ["train", "rubicap", "train.max_stepz=3"], [r"max_stepz", r"max_steps"]),
    Case("rubicap-config-type", lambda t: ["train", "rubicap", "train.max_steps=lots"], [r"max_steps", r"lots"]),
    Case("moco-config-typo", lambda t: ["train", "moco", "momentum.variantt=frozen"], [r"variantt", r"variant"]),
    Case("moco-config-type", lambda t: ["train", "moco", "train.max_steps=lots"], [r"max_steps", r"lots"]),
    # ---- train rubicap / moco: image data, named before any model loads
    Case("moco-image-missing", lambda t: ["train", "moco", *images(t, {"id": "x", "image": "gone.png", "captions": ["a", "b"]})],
         [r"images\.jsonl:2", r"missing image", r"on_bad_image"]),
    Case("moco-image-corrupt", lambda t: ["train", "moco", *images(t, {"id": "x", "image": "half.png", "captions": ["a", "b"]})],
         [r"images\.jsonl:2", r"corrupt image"]),
    Case("moco-one-reference", lambda t: ["train", "moco", *images(t, {"id": "x", "image": "red.png", "captions": ["a"]})],
         [r"images\.jsonl:2", r"missing references", r"min_references"]),
    Case("rubicap-image-row-layout", lambda t: ["train", "rubicap", f"train.out_dir={t / 'run'}",
                                                *images(t, {"id": "x", "captions": ["a"]})], [r"images\.jsonl:2", r"no image"]),
    Case("rubicap-pixmocap-layout", lambda t: ["train", "rubicap", "data.source=pixmocap", f"data.path={_pixmo_wrong(t)}"],
         [r"pixmo-?cap", r"caption"]),
    Case("moco-too-many-images", lambda t: ["train", "moco", *images(t, None), "data.n=9"], [r"asks for 9", r"only 3"]),
    # ---- rubrics build: a JSONL image manifest
    Case("rubrics-missing", lambda t: ["rubrics", "build", out(t), f"items={t / 'caps.jsonl'}"], [r"caps\.jsonl", r"not found"]),
    *[Case(f"rubrics-{kind}", lambda t, kind=kind: ["rubrics", "build", out(t), f"items={manifest(t, kind)}", "--quiet"],
           FILE_KINDS[kind]) for kind in ("empty", "malformed", "nonutf8", "dup")],
    Case("rubrics-unknown-backend", lambda t: ["rubrics", "build", out(t), "items=scenes:2", "--committee", "nosuch:model"],
         [r"nosuch", r"committee"]),
    Case("rubrics-unreachable", lambda t: ["rubrics", "build", out(t), "items=scenes:2", "writer=hf:embedded",
                                           "--committee", DEAD, "--quiet"], [URL, r"answer"]),
    # ---- report: summaries
    Case("report-missing", lambda t: ["report", out(t), str(t / "nowhere")], [r"nowhere", r"does not exist"]),
    Case("report-malformed", lambda t: ["report", out(t), str(summary_dir(t, '{"protocol": "x", "rows": ['))],
         [r"summary\.json", r"json"]),
    Case("report-nonutf8", lambda t: ["report", out(t), str(_nonutf8_summary(t))],
         [r"summary\.json", r"utf-?8"]),
    Case("report-missing-field", lambda t: ["report", out(t), str(summary_dir(t, '{"protocol": "x"}'))],
         [r"summary\.json", r"rows"]),
    Case("report-empty", lambda t: ["report", out(t), str(summary_dir(t, ""))], [r"summary\.json", r"json"]),
    # ---- an output folder given as an existing file's name (or a path under one)
    Case("identify-out-is-file", lambda t: ["eval", "identify", f"out={taken(t)}", "--captions", str(good(t, "series")),
                                            "--verifier", "claims:rules"], [r"\bout=", *TAKEN]),
    Case("identify-out-under-file", lambda t: ["eval", "identify", f"out={taken(t) / 'sub'}", "--captions",
                                               str(good(t, "series")), "--verifier", "claims:rules"],
         [r"\bout=", r"cannot be made", *TAKEN]),
    Case("bottleneck-out-is-file", lambda t: ["eval", "bottleneck", f"out={taken(t)}", "--captions",
                                              str(good(t, "series")), "--quiet"], [r"\bout=", *TAKEN]),
    Case("spans-out-is-file", lambda t: ["eval", "spans", f"out={taken(t)}", "--captions", str(good(t, "series")),
                                         "--quiet"], [r"\bout=", *TAKEN]),
    Case("entail-out-is-file", lambda t: ["eval", "entail", f"out={taken(t)}", "--captions", str(good(t, "caption")),
                                          "--quiet"], [r"\bout=", *TAKEN]),
    Case("report-out-is-file", lambda t: ["report", f"out={taken(t)}", str(summary_dir(t, '{"protocol": "x", "rows": []}'))],
         [r"\bout=", *TAKEN]),
    Case("candidates-out-is-file", lambda t: ["candidates", "--corpus", str(long_corpus(t)), "--out", str(taken(t)),
                                              "--length", "4", "--k", "2", "--quiet"], [r"\bout=", *TAKEN]),
    Case("lineup-out-dir-is-file", lambda t: ["train", "lineup", f"train.out_dir={taken(t)}", "train.max_steps=1"],
         [r"train\.out_dir=", *TAKEN]),
    Case("caption-out-is-folder", lambda t: ["caption", f"out={t}", "captioner=describer", "length=4", "limit=2"],
         [r"\bout\b", r"folder"]),
]


def images(tmp: Path, bad: dict[str, object] | None) -> list[str]:
    """Overrides pointing the image data at a manifest of 3 good PNG files (2 captions each) with ``bad`` as
    line 2; ``half.png`` is a PNG cut in half (opens, does not decode)."""
    from PIL import Image

    Image.new("RGB", (8, 8), (200, 30, 30)).save(tmp / "red.png")
    data = (tmp / "red.png").read_bytes()
    (tmp / "half.png").write_bytes(data[: len(data) // 2])
    rows = [{"id": f"ok{i}", "image": "red.png", "captions": ["a red square", "red on red"]} for i in range(3)]
    lines = [json.dumps(r) for r in [rows[0], *([bad] if bad else []), *rows[1:]]]
    (tmp / "images.jsonl").write_text("\n".join(lines) + "\n")
    return ["data.source=manifest", f"data.path={tmp / 'images.jsonl'}", "data.n=null"]


def _pixmo_wrong(tmp: Path) -> Path:
    p = tmp / "pixmo.jsonl"
    p.write_text(json.dumps({"image_url": "https://a.org/b.jpg", "text": "no caption column"}) + "\n")
    return p


def _questions(tmp: Path, rows: list[dict[str, object]]) -> Path:
    p = tmp / "questions.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _yaml(tmp: Path, text: str) -> Path:
    p = tmp / "run.yaml"
    p.write_text(text)
    return p


def _nonutf8_summary(tmp: Path) -> Path:
    d = tmp / "run8"
    d.mkdir()
    (d / "summary.json").write_bytes(b'{"protocol": "caf\xe9", "rows": []}')
    return d


TQDM = re.compile(r"\[\d+:\d\d")  # tqdm's elapsed-time field, e.g. "[00:00<?, ?it/s]"


def message_lines(err: str) -> list[str]:
    """stderr without progress bars (tqdm redraws with carriage returns): the lines a user reads."""
    shown = [line.rsplit("\r", 1)[-1] for line in err.split("\n")]
    return [line for line in shown if line.strip() and not TQDM.search(line)]


def _scored(tmp: Path, system: str, n: int) -> None:
    rows = {r["system"]: r for r in json.loads((tmp / "out" / "summary.json").read_text())["rows"]}
    assert rows[system]["n_scored"] == n, rows


def run_cli(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    t0 = time.perf_counter()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    return code, capsys.readouterr().err, time.perf_counter() - t0


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=c.marks) for c in CASES])
def test_bad_input(case: Case, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = case.argv(tmp_path)
    code, err, seconds = run_cli(argv, capsys)
    lines = [ln for ln in message_lines(err)]
    assert "Traceback" not in err, err
    assert code == case.code, f"exit {code}, stderr: {err}"
    assert seconds < FAST_S, f"took {seconds:.1f} s: {err}"
    if case.code == 2:
        assert len(lines) == 1, f"stderr is not one line: {err!r}"
        assert lines[0].startswith("error: "), err
        assert "Fix:" in lines[0], err
        for pattern in case.must:
            assert re.search(pattern, lines[0], re.IGNORECASE), f"{pattern!r} not in {lines[0]!r}"
    if case.check is not None:
        case.check(tmp_path)


def test_items_missing_from_one_file_are_noted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Usable input: items not captioned by every file are left out of the comparison, and said so."""
    from captionrl.eval.bottleneck import BottleneckConfig, load_caption_files
    from captionrl.eval.identification import _load_caption_files

    full = good(tmp_path, "series")
    part = tmp_path / "part.jsonl"
    part.write_text("\n".join(good_lines("series")[:4]) + "\n")
    items, _systems = _load_caption_files([str(full), str(part)])
    assert sorted(it.id for it in items) == ["it0", "it1", "it2", "it3"]
    err = "\n".join(caplog.messages)
    assert "note: 2 item(s) of good skipped" in err and "it4, it5" in err, err
    caplog.clear()
    study = load_caption_files([("good", full), ("part", part)], BottleneckConfig(out=str(tmp_path / "b")))
    assert sorted(it.id for it in study.items) == ["it0", "it1", "it2", "it3"]
    err = "\n".join(caplog.messages)
    assert "note: 2 item(s) of good skipped" in err and "it4, it5" in err, err
