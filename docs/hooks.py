"""MkDocs hooks of the site (mkdocs.yml ``hooks:``).

popgrpo's docstrings name other objects with Sphinx roles (``:func:`group_advantages```,
``:mod:`~popgrpo.core.grpo```), which mkdocstrings renders as written. The role is dropped
here, leaving the name in code type, as Sphinx would show it.

BENCHMARKS.md, at the repository root, links the pages under docs/ by their path from the root
(``docs/benchmarks/suite.md``), as GitHub resolves them. The page that shows it on the site
(studies/benchmarks.md, one ``--8<-- "BENCHMARKS.md"`` line) gets its text here, those links
made relative to that page, before the snippets extension would include it unchanged.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):<code>~?")
_INCLUDE = re.compile(r'^--8<-- "BENCHMARKS\.md"$', re.MULTILINE)
_DOCS_LINK = re.compile(r"\]\(docs/([^)\s]+)\)")


def on_page_markdown(markdown: str, page, config, **kwargs) -> str:
    if not _INCLUDE.search(markdown):
        return markdown
    text = (Path(config.config_file_path).parent / "BENCHMARKS.md").read_text()
    here = posixpath.dirname(page.file.src_uri) or "."
    text = _DOCS_LINK.sub(lambda m: f"]({posixpath.relpath(m.group(1), here)})", text)
    return _INCLUDE.sub(lambda _: text, markdown)


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub("<code>", html)
