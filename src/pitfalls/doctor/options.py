"""What a doctor run is asked for: its phases' step counts and its wall-time budget."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["BEFORE_SCAN_STEPS", "DEFAULT_BUDGET_S", "DEFAULT_SCANNED", "DEFAULT_STEPS", "DEFAULT_WARMUP",
           "DoctorOptions"]

DEFAULT_WARMUP = 3
DEFAULT_STEPS = 10
# Five: a line run every fifth step reads 0.2 per step, whichever step the scan starts on.
DEFAULT_SCANNED = 5
# Steps whose process-group memory is sampled, apart from the timed ones (where the sampler would share their cores).
DEFAULT_MEMORY = 5
DEFAULT_BUDGET_S = 300.0
# The step before the scan runs under the provenance record: what the first scanned step reads and its previous
# step made (a batch fetched ahead, before the step's end) is then known for what it is.
BEFORE_SCAN_STEPS = 1


@dataclass(frozen=True)
class DoctorOptions:
    """The steps of each phase and the budget of one run.

    Attributes:
        warmup: steps before anything is timed (>= 1). The first runs eagerly while the tensors it makes on the
            host are recorded (an optimizer's host-side step count), so torch.compile compiles from the second.
        steps: timed steps (>= 1): step time, the loader's wait, memory.
        scanned: steps under the hazard counter and the copy recorder (>= 1); on a GPU as many again under the
            sync debug mode.
        budget_s: wall seconds after which the script is stopped wherever it is (> 0).
        memory: steps after the scanned ones whose process-group memory is sampled (>= 1; none where the script
            uses CUDA: the allocator's peaks come with the timed steps).
        trial: a trial of `--try`: the timed steps' times and waits alone (no memory sampled), and the run stopped
            after them.
        digests: the first batches whose digests are kept (`phases.batch_digest`), to compare runs' batches.
        cuda_on_cpu: run a script written for CUDA on the CPU, its CUDA calls mapped there
            (`pitfalls.doctor.cuda_on_cpu`).
    """

    warmup: int = DEFAULT_WARMUP
    steps: int = DEFAULT_STEPS
    scanned: int = DEFAULT_SCANNED
    budget_s: float = DEFAULT_BUDGET_S
    memory: int = DEFAULT_MEMORY
    trial: bool = False
    digests: int = 0
    cuda_on_cpu: bool = False

    def __post_init__(self) -> None:
        for name, least in (("warmup", 1), ("steps", 1), ("scanned", 1), ("memory", 1), ("digests", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name}={value!r} is not allowed; it must be an int >= {least}")
        budget = self.budget_s
        if isinstance(budget, bool) or not isinstance(budget, (int, float)) or not budget > 0:
            raise ValueError(f"budget_s={budget!r} is not allowed; it must be a number of seconds > 0")

    @property
    def cpu_steps(self) -> int:
        """The steps a run takes without a GPU: warm-up, timed, the one before the scan, scanned, and memory."""
        return self.warmup + self.steps + BEFORE_SCAN_STEPS + self.scanned + self.memory
