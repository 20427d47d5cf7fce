"""MkDocs hooks for this site (mkdocs.yml ``hooks:``).

The package's docstrings are written for Sphinx as much as for a terminal: they use
roles such as ``:func:`patch``` and ``:meth:`close```. mkdocstrings renders the role's
target as code and leaves the role's name in front of it; this hook removes that name,
so the API pages read ``patch`` where the docstring says ``:func:`patch```.
"""

from __future__ import annotations

import re

_ROLE = re.compile(r":(?:func|meth|class|attr|mod|data|exc|obj):(?=<code)")


def on_page_content(html: str, **kwargs) -> str:
    return _ROLE.sub("", html)
