"""asv's published site, made self-contained (no CDN) and served on loopback only.

- `pitfalls.site.localize.publish` copies the vendored JavaScript/CSS into a site ``asv publish`` wrote and points
  every CDN address at it, keeping the integrity hashes.
- `pitfalls.site.server.serve` / ``serving`` serve the site over HTTP on 127.0.0.1 (the site loads its data by XHR).
- `pitfalls.site.browser.render_page` renders a page in headless Chromium with the network cut off and returns its
  DOM.

The submodules double as commands (``python -m pitfalls.site.localize``, ``.server``, ``.assets``), so this
package imports none of them: importing them here would load each command's module twice when it runs.
"""
