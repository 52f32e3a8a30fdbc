"""Loads the benchmark probe into torchrun's workers; a no-op in every other process.

Python imports `sitecustomize` at start-up from the first folder on sys.path that has one, so
putting bench/probe on PYTHONPATH measures a training command without changing it. See
bench_probe.py for what is measured and how.
"""

import os

if os.environ.get("BENCH_PROBE_DIR") and "RANK" in os.environ:
    import bench_probe

    bench_probe.install(os.environ["BENCH_PROBE_DIR"], int(os.environ["RANK"]))
