"""Every decision this project makes on a GPU node, through the unchanged launch scripts, on a simulated node.

The simulation (tests/simulated_gpu_node: a sitecustomize.py on PYTHONPATH and an nvidia-smi on
PATH) answers only device queries: how many GPUs (narrowed by CUDA_VISIBLE_DEVICES), their compute
capability, name and memory, and which one a process pinned. Each worker ends at
torch.distributed.init_process_group, the first call that needs a real GPU, after writing what it
chose there (rank, pinned GPU, backend, device_id, timeout) as one JSON line.

Covered here: NPROC_PER_NODE=auto counting the GPUs, the preflight parsing and checking on a node of 8
GPUs without claiming one, the launcher forking the workers from a process that has not initialised
CUDA, each rank pinning its own GPU before the process group starts, nccl chosen, the group bound to the
rank's GPU with --ddp_timeout, mixed precision auto resolving to bf16 (capability 8.0 and up) or fp16
(7.x), bf16 and fp16 refused where unsupported, predict alone on several GPUs, the doctor's GPU count and
precision check, and the Trainer's --fsdp true as far as its settings for accelerate; in one process,
device.py's choice of GPU and precision with torch.cuda's queries patched. Out of reach (only
a real GPU shows them): NCCL itself, training and evaluating on the GPU, autocast and GradScaler, FSDP's
sharding, and speed; the template's bench/gpu_check.sh runs those on a real GPU.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import IS_NATIVE, PACKAGE, REPO_ROOT, finish, names_from, package_module, run_env, smoke_flags, start

pytestmark = pytest.mark.slow  # real launches: `make test-all`

SIMULATION = REPO_ROOT / "tests" / "simulated_gpu_node"
SCRIPT = REPO_ROOT / "scripts" / "train_single_node.sh"


def gpu_node_env(tmp_path: Path, gpus: int, capability: str = "8.0", **extra: str) -> dict[str, str]:
    """The environment of a node of `gpus` simulated GPUs of this compute capability."""
    env = run_env(SIMULATED_GPUS=str(gpus), SIMULATED_GPU_CAPABILITY=capability,
                  SIMULATED_GPU_RECORD=str(tmp_path / "ranks.jsonl"), **extra)
    env["PYTHONPATH"] = os.pathsep.join([str(SIMULATION), env["PYTHONPATH"]])
    env["PATH"] = os.pathsep.join([str(SIMULATION), env["PATH"]])
    if "CUDA_VISIBLE_DEVICES" not in extra:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    return env


def ranks(tmp_path: Path) -> list[dict]:
    """What each worker chose when it reached init_process_group, by rank."""
    record = tmp_path / "ranks.jsonl"
    lines = record.read_text().splitlines() if record.is_file() else []
    return sorted((json.loads(line) for line in lines), key=lambda rank: rank["rank"])


def launch(tmp_path: Path, smoke_assets: Path, env: dict[str, str], *flags: str) -> subprocess.CompletedProcess:
    """configs/smoke.yaml (which asks for fp32) with the default --mixed_precision auto, and flags."""
    command = [str(SCRIPT), *smoke_flags(smoke_assets, tmp_path / "out"), "--mixed_precision", "auto", *flags]
    return finish(start(command, env), timeout=300)


def test_the_simulated_node_answers_device_queries_only(tmp_path: Path) -> None:
    env = gpu_node_env(tmp_path, 8, "9.0", CUDA_VISIBLE_DEVICES="1,6")
    probe = ("import torch; counted = (torch.cuda.device_count(), torch.cuda.is_available()); "
             "print(*counted, torch.cuda.is_initialized()); torch.cuda.set_device(1); "
             "print(torch.cuda.get_device_capability(0), torch.cuda.current_device(), torch.cuda.is_initialized())")
    result = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["2", "True", "False", "(9,", "0)", "1", "True"]
    listing = subprocess.run(["nvidia-smi", "-L"], env=env, capture_output=True, text=True, check=True).stdout
    assert len(listing.splitlines()) == 8


def test_auto_on_8_gpus_passes_the_preflight_and_starts_8_ranks_each_on_its_own_gpu(
    smoke_assets: Path, tmp_path: Path
) -> None:
    result = launch(tmp_path, smoke_assets, gpu_node_env(tmp_path, 8, "9.0", NPROC_PER_NODE="auto"))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "8 process(es) on 8 GPU(s), precision bf16: settings and data look right" in result.stdout
    assert "--nproc-per-node=8" in result.stderr
    chosen = ranks(tmp_path)
    assert [rank["rank"] for rank in chosen] == list(range(8))
    for rank in chosen:
        # Pinned before the group starts, and the group bound to that GPU: NCCL would use GPU 0 otherwise.
        assert rank["current_device"] == rank["local_rank"] == rank["rank"]
        assert rank["device_id"] == f"cuda:{rank['local_rank']}"
        assert (rank["world_size"], rank["backend"], rank["timeout_s"]) == (8, "nccl", 1800)
    assert "world size 8, device cuda:0, backend nccl, precision bf16" in result.stdout
    assert not (tmp_path / "out").exists(), "nothing may be written before the process group starts"


def test_cuda_visible_devices_narrows_auto_and_gpus_without_native_bf16_get_fp16(
    smoke_assets: Path, tmp_path: Path
) -> None:
    env = gpu_node_env(tmp_path, 8, "7.0", NPROC_PER_NODE="auto", CUDA_VISIBLE_DEVICES="2,5,7")
    result = launch(tmp_path, smoke_assets, env, "--ddp_timeout", "600")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "3 process(es) on 3 GPU(s), precision fp16" in result.stdout
    assert "world size 3, device cuda:0, backend nccl, precision fp16" in result.stdout
    assert [(rank["rank"], rank["device_id"], rank["timeout_s"]) for rank in ranks(tmp_path)] == [
        (0, "cuda:0", 600), (1, "cuda:1", 600), (2, "cuda:2", 600)]  # torch numbers the visible GPUs from 0


@pytest.mark.parametrize(("gpus", "capability", "flags", "message"), [
    (2, "7.0", ["--mixed_precision", "bf16"], "error: --mixed_precision bf16: this GPU has no native bf16"),
    (2, "7.5", ["--bf16", "true"], "error: --mixed_precision bf16: this GPU has no native bf16"),
    (0, "8.0", ["--mixed_precision", "fp16"], "error: --mixed_precision fp16 needs a CUDA GPU"),
], ids=["bf16 on a V100", "--bf16 on a T4", "fp16 without a GPU"])
def test_unsupported_precision_is_one_error_line_before_any_worker_starts(
    smoke_assets: Path, tmp_path: Path, gpus: int, capability: str, flags: list[str], message: str
) -> None:
    env = gpu_node_env(tmp_path, gpus, capability, NPROC_PER_NODE="2")
    result = launch(tmp_path, smoke_assets, env, *flags)
    assert result.returncode == 2
    shown, *rest = result.stderr.splitlines()  # the script shows the launcher's command, which checks first
    assert shown.startswith("+ ") and f"-m {PACKAGE}.torchrun " in shown
    assert len(rest) == 1 and rest[0].startswith(message), result.stderr
    assert ranks(tmp_path) == []


def test_predict_alone_on_8_gpus_takes_the_first_and_says_so(smoke_assets: Path, tmp_path: Path) -> None:
    command = [sys.executable, "-m", f"{PACKAGE}.predict", "--model_name_or_path", str(smoke_assets / "tiny-bert"),
               "--input_file", str(smoke_assets / "validation.jsonl"), "--output_file", str(tmp_path / "out.jsonl")]
    result = finish(start(command, gpu_node_env(tmp_path, 8)), timeout=120)
    assert "8 GPUs are visible to this one process: it uses cuda:0 alone" in result.stdout
    # The simulation ends here: moving the model onto cuda:0 needs a real GPU (and its driver, says torch 2.8).
    assert result.returncode != 0 and ("CUDA" in result.stderr or "NVIDIA driver" in result.stderr)


def doctor(tmp_path: Path, smoke_assets: Path, gpus: int, capability: str, *flags: str) -> dict:
    """The doctor alone on a node of `gpus` GPUs, for 8 processes: its exit status, stderr, and its check
    lines by name."""
    command = [sys.executable, "-m", f"{PACKAGE}.doctor", *smoke_flags(smoke_assets, tmp_path / "out"),
               "--mixed_precision", "auto", *flags]
    result = finish(start(command, gpu_node_env(tmp_path, gpus, capability, NPROC_PER_NODE="8")), timeout=120)
    lines = {line.split(":")[0].split()[1]: line for line in result.stdout.splitlines()
             if line.startswith(("PASS", "FAIL", "WARN", "SKIP"))}
    return {"returncode": result.returncode, "stderr": result.stderr, **lines}


def test_the_doctor_checks_the_gpu_count_and_the_precision_they_support(smoke_assets: Path, tmp_path: Path) -> None:
    healthy = doctor(tmp_path, smoke_assets, 8, "8.0")
    assert healthy["GPUs"] == ("PASS  GPUs: 8 x Simulated GPU (80 GiB, capability 8.0); precision bf16; "
                               "one process per GPU")
    assert healthy["returncode"] == 0, healthy["stderr"][-3000:]
    short = doctor(tmp_path, smoke_assets, 4, "7.0")
    assert short["GPUs"].startswith("FAIL  GPUs: 8 processes on this node but 4 GPU(s) visible (4 x Simulated GPU "
                                    "(80 GiB, capability 7.0); precision fp16)")
    assert short["returncode"] == 1
    # bf16 where the GPU has none: train's parser refuses it, and the doctor ends with train's error line.
    refused = doctor(tmp_path, smoke_assets, 8, "7.0", "--mixed_precision", "bf16")
    assert refused.keys() == {"returncode", "stderr"} and refused["returncode"] == 2
    assert refused["stderr"].startswith("error: --mixed_precision bf16: this GPU has no native bf16")


# What the Trainer hands accelerate for --fsdp true, in one process: parsed as train.py parses it, the model
# loaded and its block class named (parallel.parallelize), then accelerate's plugin built from the settings and
# its wrap policy applied to the model, as the Trainer and accelerate's prepare do.
FSDP_SETTINGS = f"""
import json, sys
from accelerate.utils import FullyShardedDataParallelPlugin
from accelerate.utils.fsdp_utils import fsdp2_prepare_auto_wrap_policy
from {PACKAGE} import config, data, modeling, parallel, training_args

model_args, _, args = config.parse_args(training_args.TrainingArguments, sys.argv[1:])
model = modeling.load_model(model_args, data.Task("single_label_classification", ["negative", "positive"]))
parallel.shard_blocks_of(model, args)
plugin = FullyShardedDataParallelPlugin(**args.fsdp_plugin_args)
plugin.set_auto_wrap_policy(model)
wraps = fsdp2_prepare_auto_wrap_policy(plugin, model)
print(json.dumps({{"use_cpu": args.use_cpu, "bf16": args.bf16, "version": plugin.fsdp_version,
                  "reshard_after_forward": plugin.reshard_after_forward, "state_dict_type": str(plugin.state_dict_type),
                  "wrapped": [name for name, module in model.named_modules() if wraps(module)]}}))
"""


@pytest.mark.skipif(IS_NATIVE, reason="the native loop's --fsdp shards without accelerate")
@pytest.mark.skipif(not hasattr(package_module("parallel"), "shard_blocks_of"), reason="rendered without FSDP")
def test_trainer_fsdp_on_gpus_starts_every_rank_and_gives_accelerate_fsdp2_over_each_transformer_block(
    smoke_assets: Path, tmp_path: Path
) -> None:
    """On CPU --fsdp true is refused (test_training_args.py); here the node has GPUs. Beyond the simulation's
    end at init_process_group: accelerate's state (it needs the process group), the bf16 policy it sets from
    the precision, fully_shard itself and the FULL_STATE_DICT saves (bench/gpu_check.sh)."""
    result = launch(tmp_path, smoke_assets, gpu_node_env(tmp_path, 4, "9.0", NPROC_PER_NODE="auto"), "--fsdp", "true")
    assert result.returncode == 0, result.stderr[-3000:]
    assert "4 process(es) on 4 GPU(s), precision bf16: settings and data look right" in result.stdout
    assert [(rank["rank"], rank["device_id"], rank["backend"]) for rank in ranks(tmp_path)] == [
        (rank, f"cuda:{rank}", "nccl") for rank in range(4)]

    flags = ["--model_name_or_path", str(smoke_assets / "tiny-bert"), "--train_file", "train.jsonl",
             "--mixed_precision", "auto", "--fsdp", "true"]
    one = finish(start([sys.executable, "-c", FSDP_SETTINGS, *flags], gpu_node_env(tmp_path, 1, "9.0")), timeout=120)
    assert one.returncode == 0, one.stderr[-3000:]
    assert json.loads(one.stdout.splitlines()[-1]) == {
        "use_cpu": False, "bf16": True, "version": 2, "reshard_after_forward": True,
        "state_dict_type": "StateDictType.FULL_STATE_DICT", "wrapped": ["bert.encoder.layer.0", "bert.encoder.layer.1"]}


# ---- in one process: device.py's choices, with torch.cuda's queries patched ---------------------------------

ConfigError = names_from("config", "ConfigError")
device = package_module("device")
resolve_device_settings = device.resolve_device_settings


@pytest.mark.usefixtures("isolated_process")
def test_bf16_support_is_read_from_this_ranks_gpu_without_emulation_or_pinning(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: asked.append(index) or (7, 0))
    monkeypatch.setattr(torch.cuda, "set_device", lambda index: pytest.fail("a query must not pin a GPU"))
    resolve_device_settings("bf16", cuda_available=False)
    assert asked == []
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device_settings("auto", cuda_available=True).precision == "fp16"  # 7.0: bf16 only emulated
    assert asked == [3]


@pytest.fixture
def gpus(monkeypatch: pytest.MonkeyPatch, isolated_process: None):
    """Pretend `count` GPUs are visible; returns the devices pinned with torch.cuda.set_device."""
    pinned = []

    def fake(count: int) -> list:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: count > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)
        monkeypatch.setattr(torch.cuda, "set_device", pinned.append)
        return pinned
    return fake


def test_several_gpus_in_one_process_without_torchrun_are_refused(gpus) -> None:
    pinned = gpus(2)
    with pytest.raises(ConfigError, match=r"^2 GPUs are visible to one process: start one process per GPU with "
                                          r"scripts/train_single_node.sh \(torchrun\), or set CUDA_VISIBLE_DEVICES=0$"):
        device.select_device(use_cpu=False)
    assert pinned == []


def test_predict_alone_with_several_gpus_takes_the_first_and_says_so(gpus, caplog) -> None:
    pinned = gpus(8)
    with caplog.at_level(logging.INFO):
        assert device.select_device(use_cpu=False, several_gpus="first") == torch.device("cuda", 0)
    assert pinned == [0]
    assert "8 GPUs are visible to this one process: it uses cuda:0 alone" in caplog.text


def test_each_torchrun_rank_pins_its_local_gpu(gpus, monkeypatch: pytest.MonkeyPatch) -> None:
    pinned = gpus(4)
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert device.select_device(use_cpu=False) == torch.device("cuda", 3)
    assert pinned == [3]


def test_one_gpu_or_use_cpu_needs_no_torchrun(gpus) -> None:
    pinned = gpus(1)
    assert device.select_device(use_cpu=False) == torch.device("cuda", 0)
    gpus(8)
    assert device.select_device(use_cpu=True) == torch.device("cpu")
    assert pinned == [0]
