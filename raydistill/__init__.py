"""raydistill: distil large sentence encoders into small, fast ones on Ray."""

import os

# OpenMP threads that spin while waiting starve every other process on a shared CPU box (teacher and learner actors,
# Ray Data, other jobs): measured 20-70x slower steps on 2 busy cores. Sleeping waits cost ~nothing when the machine
# is quiet. Set before torch starts its thread pool; a user's explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
