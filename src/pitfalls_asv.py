"""asv plugin of the pitfalls suite: the ``installed`` environment, named by what it measures.

asv labels every results file and every series of its site by the environment that ran it. Its own choices do not
fit the main job, which measures this checkout with the torch already installed in the running interpreter:

- ``-E existing:PYTHON`` names the environment after the interpreter's absolute path
  (``existing-py_work_main_.venv_bin_python3``, in the file name and in the site's ``python`` facet) and records no
  torch version, so runs from two checkouts are two series and neither joins the virtualenv runs of its torch;
- ``--python=same`` with a ``matrix`` runs the suite once per matrix entry in one environment and labels each with
  a torch version that was not the one installed;
- the matrix' ``env``/``env_nobuild`` entries only append to a name; they cannot replace the path.

What asv does support is an environment class of one's own, loaded from a module named in ``plugins`` in
asv.conf.json (asv's conda, mamba and virtualenv environments are plugins of the same shape). This one behaves
exactly like asv's ``existing`` environment (nothing is built or installed; the commit is given with
``--set-commit-hash``) but reports the Python version and the installed torch's public version as a managed
environment does: ``installed-py3.11-torch2.13.0``, with result params ``python: 3.11`` and ``torch: 2.13.0``,
the same params as the ``virtualenv-py3.11-torch2.13.0`` runs of scripts/run-history, so both share one series
in the site whatever the checkout's path. Select it with ``asv run -E installed:same`` (or
``installed:/path/to/python``).

This module is kept outside the ``pitfalls`` package on purpose: asv imports its plugins into its own process
for every command (``asv publish`` included), and importing ``pitfalls`` would import torch there.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from asv import util
from asv.environment import EnvironmentUnavailable, ExistingEnvironment, get_env_name
from packaging.version import InvalidVersion, Version

__all__ = ["InstalledEnvironment", "interpreter_versions", "public_version"]

# One short child process: the Python version and the installed torch's version, without importing torch.
_PROBE = (
    "import sys, importlib.metadata as m\n"
    "print('%d.%d' % sys.version_info[:2])\n"
    "try:\n"
    "    print(m.version('torch'))\n"
    "except m.PackageNotFoundError:\n"
    "    print('')\n"
)


def public_version(version: str) -> str:
    """The version without its local label: ``2.13.0+cpu`` -> ``2.13.0``.

    The local label names the build (CPU, a CUDA version); asv.conf.json's matrix names the release
    (``torch==2.13.0``), and a series in the site is keyed by that.
    """
    try:
        return Version(version).public
    except InvalidVersion:
        return version.split("+", 1)[0]


def interpreter_versions(executable: str) -> tuple[str, str]:
    """``(python "X.Y", torch version or "")`` of an interpreter, asked in a child process."""
    out = util.check_output([executable, "-c", _PROBE]).splitlines()
    return out[0].strip(), (out[1].strip() if len(out) > 1 else "")


class InstalledEnvironment(ExistingEnvironment):
    """asv's ``existing`` environment, labelled by its Python and torch versions instead of its path."""

    tool_name = "installed"

    def __init__(self, conf: Any, executable: str, requirements: dict[str, str], tagged_env_vars: dict) -> None:
        # asv passes the matrix entry's requirements; asv.conf.json excludes every entry for this environment,
        # and the torch measured is whatever the interpreter has, so there is nothing to take from them.
        del requirements
        try:
            resolved = os.path.abspath(util.which(sys.executable if executable == "same" else executable))
            python, torch = interpreter_versions(resolved)
        except (util.ProcessError, OSError) as err:
            raise EnvironmentUnavailable(f"installed: cannot run {executable!r}: {err}") from err
        if not torch:
            raise EnvironmentUnavailable(f"installed: torch is not installed for {resolved}")
        # Set before asv's constructor runs: it computes the name (ASV_ENV_NAME) from them.
        self._label_python = python
        self._label_requirements = {"torch": public_version(torch)}
        super().__init__(conf, resolved, {}, tagged_env_vars)
        # asv's `existing` stores the interpreter's path here; results take `python` from this attribute.
        self._python = python
        self._requirements = dict(self._label_requirements)

    @property
    def name(self) -> str:
        return get_env_name(self.tool_name, self._label_python, self._label_requirements, self._tagged_env_vars)
