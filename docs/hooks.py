"""MkDocs hooks of the site (mkdocs.yml ``hooks:``).

popgrpo's docstrings name other objects with Sphinx roles (``:func:`group_advantages```,
``:mod:`~popgrpo.core.grpo```), which mkdocstrings renders as written. The role is dropped
here, leaving the name in code type, as Sphinx would show it.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|obj|exc):<code>~?")


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub("<code>", html)
