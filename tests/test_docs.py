"""The user documentation stays true: docs/cli.md matches the parser, and every relative link in
README.md and docs/*.md points to a file (and heading) that exists."""

import re
from pathlib import Path

from bertheads.cli import reference

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def test_cli_reference_is_current():
    text = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert reference.render() == text, "docs/cli.md is stale: run python -m bertheads.cli.reference > docs/cli.md"


def test_cli_reference_is_stable(monkeypatch):
    """No terminal width, colour or environment variable changes the page."""
    first = reference.render()
    monkeypatch.setenv("COLUMNS", "37")
    monkeypatch.setenv("BERTHEADS_TOKEN", "not-a-secret-0123")
    monkeypatch.setenv("BERTHEADS_CACHE", "/somewhere/else")
    second = reference.render()
    assert first == second
    assert "not-a-secret-0123" not in second and "/somewhere/else" not in second
    assert str(Path.home()) + "/" not in second


def anchors(path: Path) -> set[str]:
    """GitHub's anchors for the headings of a Markdown file (code fences skipped)."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    fence = False
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("```"):
            fence = not fence
            continue
        found.update(re.findall(r"<a (?:id|name)=\"([^\"]+)\"", line))
        match = None if fence else re.match(r"^#{1,6} +(.*?) *#*$", line)
        if not match:
            continue
        slug = re.sub(r"[^\w\- ]", "", match.group(1).lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        found.add(slug if n == 0 else f"{slug}-{n}")
    return found


def links(path: Path):
    fence = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.startswith("```"):
            fence = not fence
            continue
        if fence:
            continue
        for target in LINK.findall(re.sub(r"`[^`]*`", "", line)):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
                continue
            yield number, target


def test_relative_links_resolve():
    broken = []
    for page in PAGES:
        for number, target in links(page):
            file_part, _, anchor = target.partition("#")
            dest = (page.parent / file_part).resolve() if file_part else page
            where = f"{page.relative_to(ROOT)}:{number}: {target}"
            if not dest.exists():
                broken.append(f"{where} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{where} (no heading #{anchor})")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_every_docs_page_is_in_the_index():
    index = (ROOT / "docs" / "index.md").read_text(encoding="utf-8")
    missing = [p.name for p in PAGES[1:] if p.name != "index.md" and f"({p.name}" not in index]
    assert not missing, f"docs/index.md does not link: {', '.join(missing)}"
