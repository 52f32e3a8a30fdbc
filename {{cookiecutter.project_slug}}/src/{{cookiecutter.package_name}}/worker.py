"""`worker.py MODULE ARGS...`: what each worker that torchrun.py forks runs, `python -m MODULE ARGS...` as a
new process would (torchrun.run_module). torchrun's --run-path runs this file as a script."""

import sys

from {{ cookiecutter.package_name }}.torchrun import run_module

if __name__ == "__main__":
    run_module(sys.argv[1:])
