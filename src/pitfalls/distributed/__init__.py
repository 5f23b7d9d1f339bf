"""A group of ranks started once and driven one command at a time, for any family whose step spans processes.

`launch.RankGroup` starts the ranks (torchrun's environment contract, one process per rank, held as
`psutil.Process` from the start), `control` is the loopback channel they are driven through, `server.serve` is
the rank's side (a table of commands), and `steps` the one routine that times a step wherever it runs.
"""

from pitfalls.distributed.control import loopback_store
from pitfalls.distributed.launch import RankFailed, RankGroup
from pitfalls.distributed.server import serve
from pitfalls.distributed.steps import step_seconds, time_steps

__all__ = ["RankFailed", "RankGroup", "loopback_store", "serve", "step_seconds", "time_steps"]
