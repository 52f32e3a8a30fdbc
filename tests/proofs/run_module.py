"""`python tests/run_module.py MODULE ARGS...` runs MODULE as `python -m MODULE ARGS...` does: for torchrun's
--run-path, which runs a script (warm_launch.torchrun)."""

import runpy
import sys

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
