import os

# keep the tests on one thread per process: the machine has 2 cores and several ranks
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MPLBACKEND", "Agg")
