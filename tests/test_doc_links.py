"""Every relative link in README.md, CHANGELOG.md and docs/ (results included) names a file or folder that
exists, and every anchor into a Markdown file names one of its headings: a doc that moves or renames a file
breaks no link silently. Runs in well under a second, no model."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CODE = re.compile(r"```.*?```|`[^`\n]*`", re.S)


def doc_files() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {anchor(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, re.M)}


def broken_links(files: list[Path]) -> list[str]:
    bad = []
    for doc in files:
        text = CODE.sub("", doc.read_text())
        for m in LINK.finditer(text):
            target = m.group(1)
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("mailto:"):
                continue  # http(s) and other schemes: not checked offline
            path_part, _, frag = target.partition("#")
            dest = doc if not path_part else (doc.parent / path_part).resolve()
            if not dest.exists():
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif frag and dest.suffix == ".md" and frag not in anchors(dest):
                bad.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    return bad


def test_every_relative_link_in_the_docs_resolves():
    assert not broken_links(doc_files())


def test_the_check_sees_a_broken_link_and_a_broken_anchor(tmp_path):
    (tmp_path / "a.md").write_text("# Title\n\n## A heading\n\n[ok](#a-heading) [ok](a.md#title) "
                                   "[gone](missing.md) [bad anchor](a.md#nowhere) `[in code](missing2.md)` "
                                   "[web](https://example.com/x)\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        bad = broken_links([tmp_path / "a.md"])
    finally:
        ROOT = saved
    assert bad == ["a.md: missing.md (no such file)", "a.md: a.md#nowhere (no such heading)"]
