"""Loads the benchmark probe into torchrun's workers; a no-op in every other process.

A worker torchrun starts as a command has RANK from its start. A launcher that forks its workers (the
projects' torchrun.py) has not: there the probe waits for the first forward of a process with a RANK.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one, so
putting bench/probe on PYTHONPATH measures a training command without changing it. See
bench_probe.py for what is measured and how.
"""

import os

if os.environ.get("BENCH_PROBE_DIR"):
    import bench_probe

    if "RANK" in os.environ:
        bench_probe.install(os.environ["BENCH_PROBE_DIR"], int(os.environ["RANK"]))
    else:
        bench_probe.install_in_forked_ranks(os.environ["BENCH_PROBE_DIR"])
