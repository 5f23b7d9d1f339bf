"""Training scripts with planted costs, the known answers of `pitfalls doctor` (`pitfalls.doctor.known`).

Each is a plain script that imports nothing of pitfalls and runs as any user's would (``python train.py ...``);
the hazard locator counts this folder as the user's code, though it lies inside the doctor's package.
"""
