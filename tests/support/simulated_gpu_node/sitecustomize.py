"""A simulated GPU node for the tests: torch sees SIMULATED_GPUS CUDA devices, and nothing else changes.

On PYTHONPATH with SIMULATED_GPUS=N (and SIMULATED_GPU_CAPABILITY=8.0 by default), every Python
process of a launch (the launch scripts' GPU count, the preflight, each torchrun worker) gets:

- device queries answered as on a node of N GPUs: is_available, device_count (CUDA_VISIBLE_DEVICES
  narrows it, as the driver does), get_device_capability, get_device_properties, get_device_name,
  is_bf16_supported, and set_device / current_device, which only record the choice;
- torch.cuda.is_initialized() true once the process has made one of the queries that initialise CUDA
  in a real process (all but is_available and device_count, which the launcher makes through NVML), so
  that a launcher that would fork its workers from an initialised process stops, as on a real node;
- the end of the simulation at torch.distributed.init_process_group: the first step that needs a
  real GPU (NCCL binds to it). The call's arguments, this process's pinned device and torchrun's
  variables are written as one JSON line to SIMULATED_GPU_RECORD, and the process ends with SystemExit(0).

Out of its reach, and so untested by it: anything that runs a kernel or allocates GPU memory (NCCL,
the model on the GPU, autocast, GradScaler, pinned-memory copies, the real bf16 speed of a GPU).
"""

import json
import os

if os.environ.get("SIMULATED_GPUS"):
    import torch
    import torch.distributed

    _TOTAL = int(os.environ["SIMULATED_GPUS"])
    _MAJOR, _MINOR = (int(part) for part in os.environ.get("SIMULATED_GPU_CAPABILITY", "8.0").split("."))
    _NAME = "Simulated GPU"
    _visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    _COUNT = _TOTAL if _visible is None else len([d for d in _visible.split(",") if d.strip() and int(d) < _TOTAL])
    _current = [0]

    class _Properties:
        name = _NAME
        major, minor = _MAJOR, _MINOR
        total_memory = 80 * 2**30
        multi_processor_count = 132

    def _index(device=None) -> int:
        if device is None:
            return _current[0]
        index = device if isinstance(device, int) else torch.device(device).index or 0
        if not 0 <= index < _COUNT:
            raise RuntimeError(f"CUDA error: invalid device ordinal {index} (simulated node: {_COUNT} visible)")
        return index

    _initialised = [False]

    def _initialising(query):
        def answer(*args, **kwargs):
            _initialised[0] = True
            return query(*args, **kwargs)
        return answer

    def _set_device(device) -> None:
        _current[0] = _index(device)

    def _end_here(backend=None, *args, **kwargs) -> None:
        timeout = kwargs.get("timeout")
        record = {
            "rank": int(os.environ.get("RANK", "0")), "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
            "world_size": int(os.environ.get("WORLD_SIZE", "1")), "backend": backend,
            "device_id": None if kwargs.get("device_id") is None else str(kwargs["device_id"]),
            "current_device": _current[0], "timeout_s": None if timeout is None else timeout.total_seconds(),
        }
        with open(os.environ["SIMULATED_GPU_RECORD"], "a") as out:
            out.write(json.dumps(record) + "\n")
        raise SystemExit(0)  # as a finished run ends (a worker forked by the launcher must return, see torchrun.py)

    torch.cuda.is_available = lambda: _COUNT > 0
    torch.cuda.device_count = lambda: _COUNT
    torch.cuda.get_device_capability = _initialising(lambda device=None: (_MAJOR, _MINOR) if _index(device) >= 0
                                                     else None)
    torch.cuda.get_device_properties = _initialising(lambda device=None: _Properties() if _index(device) >= 0
                                                     else None)
    torch.cuda.get_device_name = _initialising(lambda device=None: _NAME if _index(device) >= 0 else None)
    torch.cuda.is_bf16_supported = _initialising(lambda including_emulation=True: _MAJOR >= 8 or including_emulation)
    torch.cuda.set_device = _initialising(_set_device)
    torch.cuda.current_device = _initialising(lambda: _current[0])
    torch.cuda.is_initialized = lambda: _initialised[0]
    torch.distributed.init_process_group = _end_here
