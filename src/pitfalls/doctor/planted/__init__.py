"""Training scripts with planted costs, the known answers of `pitfalls doctor`: their paths and the arguments their
rows run them with (`pitfalls.doctor.checks`).

Each is a plain script that imports nothing of pitfalls and runs as any user's would (``python train.py ...``,
each taking ``--device``; ``gpu_path.py`` is written for CUDA, ``ddp.py`` for torchrun); the hazard locator counts
this folder as the user's code, though it lies inside the doctor's package.
"""

from pathlib import Path

__all__ = ["BATCH", "DDP", "GPU_PATH", "ITEM_MS", "LOADER", "RULES", "TRAIN", "TRAIN_ARGS"]

_HERE = Path(__file__).resolve().parent
TRAIN = _HERE / "train.py"
RULES = _HERE / "rules.py"
LOADER = _HERE / "loader.py"
# A DDP script for torchrun: its rows run it in 2 ranks (`checks.run_ranks`).
DDP = _HERE / "ddp.py"
# Written for CUDA: on a CPU its rows run it under --cuda-on-cpu (`checks.run_script`).
GPU_PATH = _HERE / "gpu_path.py"
BATCH = 8
ITEM_MS = 10.0
# train.py's endless data set of 10**6 items, its planted batch and sleep, and the eager backend: graph breaks and
# recompiles are dynamo's, decided before any backend runs, so the eager one reads them without inductor's code
# generation (10-20 s cold on these machines).
TRAIN_ARGS = ("--items", str(10**6), "--batch", str(BATCH), "--item-ms", str(ITEM_MS), "--backend", "eager")
