"""Families registered by other packages (entry points ``pitfalls.families``) or by ``PITFALLS_FAMILIES``.

Each gets the suite's shared figures with no code of its own here (see `common.plugin_classes`); with no such
family registered, this module holds no benchmark.
"""

from . import common

globals().update(common.plugin_classes(__name__))
