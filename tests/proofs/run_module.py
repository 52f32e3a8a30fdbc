"""`python run_module.py MODULE ARGS...` runs MODULE as `python -m MODULE ARGS...` does: for torchrun's
--run-path, which runs a script (warm_launch.torchrun). Here in tests/proofs/, and in tests/ of the render
the proofs are copied into (tests/test_render.py's add_proofs)."""

import runpy
import sys

if __name__ == "__main__":
    sys.argv = sys.argv[1:]
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
