"""`worker.py MODULE ARGS...`: what each worker that torchrun.py forks runs, `python -m MODULE ARGS...` as a
new process would (torchrun.run_module). torchrun's --run-path runs this file as a script, outside its
package: the package is the folder it is in."""

import importlib
import sys
from pathlib import Path

if __name__ == "__main__":
    importlib.import_module(f"{Path(__file__).parent.name}.torchrun").run_module(sys.argv[1:])
