"""asv's published site, made self-contained (no CDN) and served on loopback only.

- :func:`publish` copies the vendored JavaScript/CSS into a site ``asv publish`` wrote and points every CDN
  address at it, keeping the integrity hashes.
- :func:`serve` / :func:`serving` serve the site over HTTP on 127.0.0.1 (the site loads its data by XHR).
- :func:`render_page` renders a page in headless Chromium with the network cut off and returns its DOM.

The submodules double as commands (``python -m pitfalls.site.localize``, ``.server``, ``.assets``), so this
package imports them only when one of these names is first used: importing them here would load each command's
module twice when it runs.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "PublishReport": "pitfalls.site.localize",
    "publish": "pitfalls.site.localize",
    "make_server": "pitfalls.site.server",
    "serve": "pitfalls.site.server",
    "serving": "pitfalls.site.server",
    "render_page": "pitfalls.site.browser",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'pitfalls.site' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
