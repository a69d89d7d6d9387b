"""Prompt templates of the RubiCap pipeline (rubric writing, rubric judging); the teachers' caption
instruction is ``captionrl.domains.captioning.IMAGE_CAPTION_INSTRUCTION``.

Kept apart from the code so they can be read and compared with the papers in one place: RubiCap
(committee consensus + student deficiencies -> weighted binary rubric) and MoCo Rubric A.1.1-A.1.3
(caption prompt; rubric items ``{criterion, test, weight}``; a text-only judge that returns a reason and
a binary decision per criterion, accepts semantic equivalents and ignores style and length).
"""

from __future__ import annotations

WRITER_SYSTEM = (
    "You write grading rubrics for image captions. You output JSON only."
)

WRITER_TEMPLATE = """Several expert captioners described the same image. Their captions:
{teachers}

The student model's current captions of this image:
{students}

Write a rubric that checks the facts the expert captions agree on, focusing on what the student captions \
miss or get wrong. Rules:
- Each item checks ONE fact that can be verified in the image; prefer facts most experts state.
- "criterion": the fact, written as a short declarative sentence a good caption would state.
- "test": how a grader decides, from the caption alone, whether the criterion is satisfied (yes or no).
- "weight": 3 = critical (main objects, text, counts), 2 = important, 1 = minor detail.
- Write {min_items} to {max_items} items; no overlapping items; no items about style or length.

Reply with a JSON list only, for example:
[{{"criterion": "The cake carries the text 24 CARROT CAKE.", "test": "Yes if the caption mentions the text \
'24 CARROT CAKE'.", "weight": 3}}]"""

NO_STUDENT = "(none yet)"

WRITER_EXAMPLE_CRITERION = "The cake carries the text 24 CARROT CAKE."
"""The example item of ``WRITER_TEMPLATE``; a reply that copies it is rejected (small writers do)."""

JUDGE_CHOOSE_TEMPLATE = """Caption: {caption}

Criterion: {criterion}
Test: {test}

Does the caption satisfy the criterion? Answer yes or no."""
"""One criterion per prompt; the first reply token's probabilities over the options give the decision."""

JUDGE_GENERATE_TEMPLATE = """You grade a caption against a rubric. You do not see the image: judge only \
what the caption states. For each criterion decide whether the caption satisfies it; accept wording with \
the same meaning; do not judge style, fluency, grammar or length unless a criterion asks for it.

Caption: {caption}

Rubric:
{criteria}

Reply with a JSON list, one object per criterion, in order:
[{{"id": 1, "reason": "<one short sentence>", "decision": "yes" or "no"}}, ...]"""

LIKELIHOOD_CONTEXT = "Caption: {caption}\nA fact stated in this caption:"
"""Likelihood mode: log p(criterion | this context) is compared with the same criterion after a neutral
caption (``LIKELIHOOD_NULL_CAPTION``); the gain per word (pointwise mutual information) is the evidence."""

LIKELIHOOD_NULL_CAPTION = "The image shows some things."
