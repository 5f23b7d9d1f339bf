"""asv.conf.json: read it as asv does, name the file when it is broken, and write the staged copies the jobs run."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

__all__ = ["CONF_NAME", "RunnerError", "load_conf", "one_line", "project_paths", "write_staged_conf"]

CONF_NAME = "asv.conf.json"
# The configuration's paths, relative to its own folder; asv changes into that folder before it uses them.
PATH_KEYS = ("repo", "benchmark_dir", "env_dir", "results_dir", "html_dir")


class RunnerError(Exception):
    """A problem the command reports in one line on stderr, exiting with status 2, before it changes anything."""


def one_line(error: BaseException) -> str:
    """An error's message on one line (its type's name when it has none)."""
    return " ".join(str(error).split()) or type(error).__name__


def load_conf(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read an asv configuration the way asv does (JSON with // comments) and check it with asv's own loader.

    Args:
        path: the asv.conf.json file.

    Returns:
        The configuration as written in the file (keys asv fills in by default are not added).

    Raises:
        RunnerError: the file is missing, is not JSON, or asv refuses it; the message names the file.
    """
    from asv import util
    from asv.config import Config

    file = Path(path).resolve()
    if not file.is_file():
        raise RunnerError(f"{file}: no such file; the suite's asv configuration is asv.conf.json at its root")
    try:
        raw = util.load_json(str(file), js_comments=True)
        if not isinstance(raw, dict):
            raise ValueError(f"expected a JSON object, found {type(raw).__name__}")
        Config.from_json(dict(raw))
    except (ValueError, util.UserError) as error:
        raise RunnerError(f"{file}: not a valid asv configuration: {one_line(error)}") from error
    return raw


def project_paths(path: str | os.PathLike[str]) -> dict[str, Path]:
    """The configuration's folders (repo, benchmark_dir, env_dir, results_dir, html_dir), made absolute."""
    from asv.config import Config

    file = Path(path).resolve()
    conf = load_conf(file)
    defaults = Config()
    return {key: (file.parent / str(conf.get(key, getattr(defaults, key)))).resolve() for key in PATH_KEYS}


def write_staged_conf(path: str | os.PathLike[str], dest: str | os.PathLike[str], *,
                      results_dir: str | os.PathLike[str], html_dir: str | os.PathLike[str] | None = None) -> Path:
    """Write ``dest/asv.conf.json``: the configuration at ``path`` with absolute paths and its own results folder.

    asv changes into the folder of the configuration it is given, so every path of the copy is made absolute;
    everything else (matrix, plugins, commands) stays as the project wrote it.

    Args:
        path: the project's asv.conf.json.
        dest: the folder to write the copy into (created).
        results_dir: where asv writes results when it runs with the copy.
        html_dir: where ``asv publish`` writes with the copy (default: the project's).

    Returns:
        The path of the copy.
    """
    conf = dict(load_conf(path))
    conf.update({key: str(folder) for key, folder in project_paths(path).items()})
    conf["results_dir"] = str(Path(results_dir).resolve())
    if html_dir is not None:
        conf["html_dir"] = str(Path(html_dir).resolve())
    folder = Path(dest)
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / CONF_NAME
    staged.write_text(json.dumps(conf, indent=4), encoding="utf-8")
    return staged
