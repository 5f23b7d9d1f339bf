"""asv's published site, made self-contained (no CDN) and served on loopback only (docs/asv.md).

The submodules double as commands (``python -m pitfalls.site.localize``, ``.server``, ``.assets``), so this
package imports none of them: importing them here would load each command's module twice when it runs.
"""
