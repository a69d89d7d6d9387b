"""Synthetic scenes with known facts: shapes, colours, positions, counts and a short word, drawn with PIL.

Real caption data has no ground truth a program can check; these scenes do. Each scene carries the
structured facts it was drawn from, so a rubric can be built from the facts (``rubric_from_facts``, below), a caption that states them can be told from one that contradicts them, and
multiple-choice questions have exact answers. Generation is deterministic: scene ``i`` of seed ``s`` is
the same picture and facts on every machine (``random.Random(f"{s}:{i}")``), and the seed is recorded
on the scene.

Layout: the canvas is a 3x3 grid; each shape group fills one of the cells named left, right, top,
bottom and center (never two groups in one cell, never two groups of the same shape), and the word,
when there is one, is written in the top-left corner cell, away from every group.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from captionrl.errors import ConfigError, DataError
from captionrl.types import RubricItem

SHAPES = ("circle", "square", "triangle")
COLOURS: dict[str, tuple[int, int, int]] = {
    "red": (220, 40, 40),
    "green": (30, 160, 60),
    "blue": (40, 80, 220),
    "yellow": (235, 200, 20),
    "purple": (140, 50, 170),
    "orange": (245, 130, 20),
}
POSITIONS: dict[str, tuple[int, int]] = {  # (column, row) of the 3x3 grid cell
    "left": (0, 1),
    "right": (2, 1),
    "top": (1, 0),
    "bottom": (1, 2),
    "center": (1, 1),
}
WORDS = ("SUN", "CAT", "STOP", "OPEN", "RAIN", "BOOK", "FISH", "MOON", "TREE", "SHIP")
NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four"}
MAX_COUNT = 3
FACT_KINDS = ("colour", "count", "position", "text")


@dataclass(frozen=True)
class ShapeGroup:
    """``count`` shapes of one kind and colour, drawn inside one grid cell."""

    shape: str
    colour: str
    count: int
    position: str


@dataclass(frozen=True)
class Scene:
    """One synthetic scene: what was drawn (``groups``, ``text``) and how (``seed``, ``index``, ``size``)."""

    id: str
    seed: int
    index: int
    groups: tuple[ShapeGroup, ...]
    text: str | None = None
    size: int = 192
    background: tuple[int, int, int] = (255, 255, 255)
    meta: Mapping[str, Any] = field(default_factory=dict)

    @property
    def facts(self) -> list[dict[str, Any]]:
        """Ground-truth facts, one dict per checkable statement (see ``FACT_KINDS``)."""
        out: list[dict[str, Any]] = []
        for g in self.groups:
            out.append({"kind": "colour", "shape": g.shape, "value": g.colour})
            out.append({"kind": "count", "shape": g.shape, "colour": g.colour, "value": g.count})
            out.append({"kind": "position", "shape": g.shape, "colour": g.colour, "value": g.position})
        if self.text:
            out.append({"kind": "text", "value": self.text})
        return out

    def render(self) -> Any:
        """Draw the scene as an RGB ``PIL.Image`` (deterministic: same scene, same pixels)."""
        return render_scene(self)

    @property
    def reference_caption(self) -> str:
        """A caption that states every fact and nothing else."""
        return caption_for(self.groups, self.text)

    @property
    def contradicting_caption(self) -> str:
        """A caption of the same form in which every fact is altered (see ``contradict``)."""
        groups, text = contradict(self)
        return caption_for(groups, text)

    @property
    def qa(self) -> list[dict[str, Any]]:
        """Multiple-choice questions derived from the facts (exact answers; options shuffled by seed)."""
        return questions_for(self)


# ---------------------------------------------------------------------- generation
def make_scene(index: int, seed: int = 0, *, size: int = 192, max_groups: int = 2, text_prob: float = 0.5) -> Scene:
    """Scene ``index`` of the family ``seed``: 1..max_groups shape groups and, with ``text_prob``, a word."""
    if not 1 <= max_groups <= len(SHAPES):
        raise ConfigError("max_groups", max_groups, f"must be 1..{len(SHAPES)} (one group per shape)",
                          "set max_groups to 1, 2 or 3")
    if size < 96:
        raise ConfigError("size", size, "is too small to draw three shapes per cell", "use size >= 96")
    rng = random.Random(f"{seed}:{index}")
    n = rng.randint(1, max_groups)
    shapes = rng.sample(SHAPES, n)
    colours = rng.sample(sorted(COLOURS), n)
    positions = rng.sample(sorted(POSITIONS), n)
    groups = tuple(
        ShapeGroup(s, c, rng.randint(1, MAX_COUNT), p) for s, c, p in zip(shapes, colours, positions, strict=True)
    )
    text = rng.choice(WORDS) if rng.random() < text_prob else None
    return Scene(id=f"scene-{seed}-{index}", seed=seed, index=index, groups=groups, text=text, size=size)


def generate_scenes(n: int, seed: int = 0, **kw: Any) -> list[Scene]:
    """The first ``n`` scenes of family ``seed`` (``make_scene(i, seed)`` for i in 0..n-1)."""
    if n < 1:
        raise ConfigError("n", n, "must be >= 1", "ask for at least one scene, e.g. scenes:8")
    return [make_scene(i, seed, **kw) for i in range(n)]


# ---------------------------------------------------------------------- drawing
def render_scene(scene: Scene) -> Any:
    from PIL import Image, ImageDraw

    img = Image.new("RGB", (scene.size, scene.size), scene.background)
    draw = ImageDraw.Draw(img)
    cell = scene.size / 3
    for g in scene.groups:
        col, row = POSITIONS[g.position]
        x0, y0 = col * cell, row * cell
        r = cell / 11  # shape radius: three shapes side by side fit in a cell with clear gaps
        step = cell / (g.count + 1)
        for k in range(g.count):
            cx, cy = x0 + step * (k + 1), y0 + cell / 2
            _draw_shape(draw, g.shape, cx, cy, r, COLOURS[g.colour])
    if scene.text:
        draw.text((cell * 0.1, cell * 0.35), scene.text, fill=(0, 0, 0), font=_font(int(cell / 4)))
    return img


def _draw_shape(draw: Any, shape: str, cx: float, cy: float, r: float, fill: tuple[int, int, int]) -> None:
    if shape == "circle":
        draw.ellipse([cx - r, cy - r, cx + r, cy + r], fill=fill)
    elif shape == "square":
        draw.rectangle([cx - r, cy - r, cx + r, cy + r], fill=fill)
    else:
        draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=fill)


def _font(size: int) -> Any:
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)
    except TypeError:  # Pillow < 10.1 has only the fixed bitmap font
        return ImageFont.load_default()


# ---------------------------------------------------------------------- captions
def _plural(shape: str, count: int) -> str:
    return shape if count == 1 else shape + "s"


def group_phrase(g: ShapeGroup) -> str:
    where = "in the center" if g.position == "center" else f"on the {g.position}" if g.position in (
        "left", "right") else f"at the {g.position}"
    return f"{NUMBER_WORDS[g.count]} {g.colour} {_plural(g.shape, g.count)} {where}"


def caption_for(groups: Sequence[ShapeGroup], text: str | None) -> str:
    """The canonical caption of a scene's content: every group, then the word (or its absence)."""
    phrases = [group_phrase(g) for g in groups]
    body = phrases[0] if len(phrases) == 1 else ", ".join(phrases[:-1]) + " and " + phrases[-1]
    caption = f"The image shows {body} on a white background."
    if text:
        caption += f' The word "{text}" is written in the top-left corner.'
    return caption


def contradict(scene: Scene) -> tuple[tuple[ShapeGroup, ...], str | None]:
    """The same scene with every fact altered: other colours, counts, positions and word (seeded).

    Shapes are kept, so the contradicting caption talks about the same objects and differs only in what
    a rubric checks. Altered colours/positions stay distinct across groups.
    """
    rng = random.Random(f"{scene.seed}:{scene.index}:contradict")
    used_c = {g.colour for g in scene.groups}
    used_p = {g.position for g in scene.groups}
    free_c = [c for c in sorted(COLOURS) if c not in used_c]
    free_p = [p for p in sorted(POSITIONS) if p not in used_p]
    rng.shuffle(free_c)
    rng.shuffle(free_p)
    groups = []
    for i, g in enumerate(scene.groups):
        other_counts = [k for k in range(1, MAX_COUNT + 2) if k != g.count]
        colour = free_c[i] if i < len(free_c) else [c for c in sorted(COLOURS) if c != g.colour][i]
        position = free_p[i] if i < len(free_p) else [p for p in sorted(POSITIONS) if p != g.position][i]
        groups.append(ShapeGroup(g.shape, colour, rng.choice(other_counts), position))
    text = rng.choice([w for w in WORDS if w != scene.text]) if scene.text else None
    return tuple(groups), text


# ---------------------------------------------------------------------- questions
def questions_for(scene: Scene, n_options: int = 4) -> list[dict[str, Any]]:
    """One multiple-choice question per fact: ``{question, options, answer (letter), fact}``."""
    rng = random.Random(f"{scene.seed}:{scene.index}:qa")
    out = []
    for fact in scene.facts:
        kind = fact["kind"]
        if kind == "colour":
            q = f"What colour are the {fact['shape']}s in the image?"
            pool = sorted(COLOURS)
        elif kind == "count":
            q = f"How many {fact['colour']} {fact['shape']}s are in the image?"
            pool = [str(k) for k in range(1, MAX_COUNT + 2)]
        elif kind == "position":
            q = f"Where are the {fact['colour']} {fact['shape']}s?"
            pool = sorted(POSITIONS)
        else:
            q = "Which word is written in the image?"
            pool = list(WORDS)
        truth = str(fact["value"])
        distractors = rng.sample([p for p in pool if p != truth], n_options - 1)
        options = [truth, *distractors]
        rng.shuffle(options)
        out.append({
            "question": q,
            "options": options,
            "answer": chr(ord("A") + options.index(truth)),
            "answer_text": truth,
            "fact": dict(fact),
        })
    return out


# ---------------------------------------------------------------------- rubrics from the facts
FACT_WEIGHTS = {"shape": 3, "colour": 3, "count": 2, "position": 2, "text": 3}
"""Colour (which objects) and the written word are the critical facts; count and position important."""


def rubric_from_facts(scene_or_facts: Any) -> list[RubricItem]:
    """An exact rubric from a synthetic scene's facts (``Scene`` or its ``facts`` list): one item per fact."""
    facts = getattr(scene_or_facts, "facts", scene_or_facts)
    items = []
    for f in facts:
        kind = f["kind"]
        if kind == "colour":
            crit = f"The {f['shape']}s are {f['value']}."
            test = f"Yes if the caption says the {f['shape']}s are {f['value']}; another colour or none is no."
        elif kind == "count":
            n = int(f["value"])
            crit = f"There are {NUMBER_WORDS.get(n, n)} {f['colour']} {f['shape']}s."
            test = f"Yes if the caption says there are exactly {n} {f['colour']} {f['shape']}s; another number is no."
        elif kind == "position":
            where = {"center": "in the center", "left": "on the left", "right": "on the right"}.get(
                f["value"], f"at the {f['value']}")
            crit = f"The {f['colour']} {f['shape']}s are {where}."
            test = f"Yes if the caption places the {f['colour']} {f['shape']}s {where}; another place is no."
        elif kind == "shape":  # easy-vqa: the one shape in the image
            crit = f"The image shows a {f['value']}."
            test = f"Yes if the caption names a {f['value']} as the shape; another shape or none is no."
        elif kind == "text":
            crit = f'The word "{f["value"]}" is written in the image.'
            test = f"Yes if the caption reports the written word {f['value']}; another word or none is no."
        else:
            raise DataError("facts.kind", kind, "unknown fact kind", "use shape, colour, count, position or text")
        items.append(RubricItem(crit, test, FACT_WEIGHTS[kind]))
    return items


def second_reference(scene: Scene) -> str:
    """A second reference of the same facts in other words (MoCo Rubric A.1.2 gives the Generator two)."""
    parts = []
    for g in scene.groups:
        where = "in the middle" if g.position == "center" else f"toward the {g.position}"
        parts.append(f"{NUMBER_WORDS[g.count].capitalize()} {g.colour} {_plural(g.shape, g.count)} sit {where} of a plain white canvas.")
    if scene.text:
        parts.append(f'Near the upper left corner the text "{scene.text}" appears in black letters.')
    return " ".join(parts)
