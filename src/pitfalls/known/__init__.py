"""Known answers: a calibration row's types (a check, what it read, its verdict), one planted run read by several
rows, and the other work a timed row waits out. Below the families, which declare their own rows."""
