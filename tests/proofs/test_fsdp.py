"""--fsdp in the native loop, trained for real on 2 CPU processes (gloo): FSDP2 trains to DDP's weights, also
compiled; its sharded checkpoints resume after SIGTERM and a killed worker through the launch script, on one
process, and without FSDP, and a DDP checkpoint resumes under FSDP; LoRA, gradient checkpointing,
accumulation and bf16 under FSDP leave an output_dir that predict, pipeline() and merge_lora load. A native
render with include_fsdp only.

The runs use the smoke BERT without dropout (test_native_resume.py's no_dropout_assets): runs on one and on
two processes then differ in their batching alone, not in their dropout streams.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import (
    EVAL_SIZE,
    PACKAGE,
    SMOKE,
    TRAIN_SIZE,
    package_module,
    read_jsonl,
    smoke_flags,
)
from safetensors.torch import load_file
from test_native_resume import no_dropout_assets  # noqa: F401 - a fixture of this module too
from test_preemption import STOPPED_EXIT_CODE, launch, wait
from test_restarts import RESUMED_FROM, crash_env, run_single_node
from tiny_decoders import make_tiny_decoder
from transformers import AutoConfig, AutoModelForSequenceClassification, pipeline
from warm_launch import run_python, torchrun

checkpoint = package_module("checkpoint")
modeling = package_module("modeling")
parallel = package_module("parallel")
smoke = package_module("smoke")

pytestmark = [pytest.mark.slow,  # real launches
              pytest.mark.skipif(torch.__version__ < parallel.FSDP_SINCE, reason="--fsdp needs a newer torch")]

STEPS_PER_EPOCH = TRAIN_SIZE // (2 * SMOKE["per_device_train_batch_size"])  # 2 ranks
TOTAL_STEPS = 3 * STEPS_PER_EPOCH
RESUMED_AT = STEPS_PER_EPOCH + STEPS_PER_EPOCH // 2  # half-way through the second epoch
FLAGS = ["--num_train_epochs", "3", "--save_strategy", "steps", "--save_steps", str(STEPS_PER_EPOCH // 2),
         "--save_total_limit", "10"]
FSDP = ["--fsdp", "true"]
# FSDP and DDP compute the same gradients but may sum them in another order: DDP all-reduces whole tensors
# and clips by the norm of all of them, FSDP reduce-scatters shards and adds their norms over the ranks.
# Measured: the runs below end bitwise equal (0 difference). With dropout and 2 accumulation steps (32 steps)
# every tensor agreed within 7.5e-9 but the attention key biases, by up to 6.5e-6: their gradient is zero in
# exact arithmetic (softmax ignores what is added to every score of a row), so all they get is rounding noise,
# which AdamW scales up to steps near the learning rate. Weights are compared without them (they change no
# output), and the eval loss, which they cannot move, is compared too.
FSDP_ATOL = 1e-6
NOISE_ONLY = ".attention.self.key.bias"
EVAL_LOSS_ATOL = 1e-6
RESUME_ATOL = 1e-6  # the same operations in the same order, as in test_preemption.py
COMPILED_ATOL = 1e-4  # inductor fuses and reorders the arithmetic: test_compile.py's tolerance
# One process with 2 accumulation steps in place of 2 ranks: other sums, as in test_native_resume.py
# (measured: every weight within 1.2e-7 of its tensor's largest, on an AMD EPYC, and 0 on an Intel Xeon,
# but the noise-only key biases, which there ended 7.6e-7 apart, 7% of their own size: left out as above).
RESHAPED_RTOL = 1e-5


def train(output_dir: Path, assets: Path, *flags: str) -> dict:
    result = torchrun(["-m", f"{PACKAGE}.train", *smoke_flags(assets, output_dir), *FLAGS, *flags])
    return {"output_dir": output_dir, "log": result.stdout + result.stderr,
            "metrics": json.loads((output_dir / "metrics.json").read_text())}


def resume_from(source: Path, output_dir: Path) -> None:
    """A copy of `source`'s checkpoint-RESUMED_AT in a fresh output_dir, as a stopped run would leave it."""
    shutil.copytree(source / f"checkpoint-{RESUMED_AT}", output_dir / f"checkpoint-{RESUMED_AT}")


def weights(output_dir: Path) -> dict[str, torch.Tensor]:
    return load_file(output_dir / "model.safetensors")


def largest_difference(expected: Path, actual: Path, relative: bool = False, skip: str | None = None) -> float:
    ours, theirs = weights(actual), weights(expected)
    assert ours.keys() == theirs.keys()
    return max(((ours[name] - theirs[name]).abs().max() / (theirs[name].abs().max() if relative else 1)).item()
               for name in ours if skip is None or skip not in name)


@pytest.fixture(scope="module")
def ddp(no_dropout_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    return train(tmp_path_factory.mktemp("ddp"), no_dropout_assets)


@pytest.fixture(scope="module")
def fsdp(no_dropout_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    return train(tmp_path_factory.mktemp("fsdp"), no_dropout_assets, *FSDP)


# ---- FSDP trains as DDP does ------------------------------------------------------------------


def test_fsdp_shards_each_bert_layer_and_the_root(fsdp: dict) -> None:
    assert fsdp["log"].count("FSDP: 2 FSDPBertLayer blocks and the root sharded over 2 ranks, computing in "
                             "torch.float32") == 1


def test_fsdp_trains_to_the_weights_ddp_trains_to(ddp: dict, fsdp: dict) -> None:
    worst = largest_difference(ddp["output_dir"], fsdp["output_dir"], skip=NOISE_ONLY)
    assert worst <= FSDP_ATOL, f"largest weight difference {worst:.3g}"
    assert fsdp["metrics"]["eval_loss"] == pytest.approx(ddp["metrics"]["eval_loss"], abs=EVAL_LOSS_ATOL)
    assert fsdp["metrics"]["train_loss"] == pytest.approx(ddp["metrics"]["train_loss"], abs=1e-6)
    assert fsdp["metrics"]["eval_num_examples"] == EVAL_SIZE


def test_fsdp_compiled_trains_to_the_weights_ddp_trains_to(ddp: dict, no_dropout_assets: Path,  # noqa: F811
                                                            tmp_path: Path) -> None:
    compiled = train(tmp_path, no_dropout_assets, *FSDP, "--torch_compile", "true")
    assert compiled["metrics"]["compiled_graphs"] >= 1, compiled["metrics"]
    worst = largest_difference(ddp["output_dir"], tmp_path, skip=NOISE_ONLY)
    assert worst <= COMPILED_ATOL, f"largest weight difference {worst:.3g}"


def test_the_final_model_is_a_plain_save_pretrained_folder(fsdp: dict) -> None:
    output_dir = fsdp["output_dir"]
    assert AutoConfig.from_pretrained(output_dir).architectures == ["BertForSequenceClassification"]
    model = AutoModelForSequenceClassification.from_pretrained(output_dir)
    assert {name: tensor.dtype for name, tensor in weights(output_dir).items()} == {
        name: torch.float32 for name in model.state_dict()}


def test_a_checkpoint_holds_each_ranks_shards_in_the_format_ddp_writes(ddp: dict, fsdp: dict) -> None:
    folders = [run["output_dir"] / f"checkpoint-{RESUMED_AT}" for run in (ddp, fsdp)]
    for folder in folders:
        assert {path.name for path in folder.iterdir()} == {
            "config.json", checkpoint.SHARDED_STATE, "tokenizer.json", "tokenizer_config.json", "batch_plan.json",
            checkpoint.TRAINING_STATE}
        assert {path.name for path in (folder / checkpoint.SHARDED_STATE).iterdir()} == {
            ".metadata", "__0_0.distcp", "__1_0.distcp"}
    # The same tensors under the same names and whole shapes, whichever wrapping wrote them.
    listed = [{name: getattr(entry, "size", None) for name, entry in
               dcp.FileSystemReader(folder / checkpoint.SHARDED_STATE).read_metadata().state_dict_metadata.items()}
              for folder in folders]
    assert listed[0] == listed[1]
    assert {f"optimizer.state.{name}.exp_avg_sq" for name in weights(fsdp["output_dir"])} <= listed[1].keys()
    assert [path.name for path in fsdp["output_dir"].iterdir() if "tmp" in path.name] == []


def test_predict_refuses_a_sharded_checkpoint_and_points_to_output_dir(fsdp: dict) -> None:
    folder = str(fsdp["output_dir"] / f"checkpoint-{RESUMED_AT}")
    with pytest.raises(package_module("config").ConfigError, match=(
            f"^--model_name_or_path '{folder}' is a checkpoint to resume from, its weights sharded in "
            "model_and_optimizer/: predict from the run's output_dir, which holds the final model$")):
        package_module("predict").load_trained_model(folder, torch.device("cpu"))


# ---- resuming across wrappings and world sizes -------------------------------------------------


@pytest.fixture(scope="module")
def fsdp_from_ddp(ddp: dict, no_dropout_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    output_dir = tmp_path_factory.mktemp("fsdp_from_ddp")
    resume_from(ddp["output_dir"], output_dir)
    return train(output_dir, no_dropout_assets, *FSDP)


def test_a_ddp_checkpoint_resumes_under_fsdp_to_ddps_weights(ddp: dict, fsdp_from_ddp: dict) -> None:
    assert f"resumed from {fsdp_from_ddp['output_dir'] / f'checkpoint-{RESUMED_AT}'} at step {RESUMED_AT}" in (
        fsdp_from_ddp["log"])
    worst = largest_difference(ddp["output_dir"], fsdp_from_ddp["output_dir"], skip=NOISE_ONLY)
    assert worst <= FSDP_ATOL, f"largest weight difference {worst:.3g}"


@pytest.mark.parametrize("flags", [[], FSDP], ids=["plain", "with --fsdp"])
def test_an_fsdp_checkpoint_of_two_processes_resumes_on_one_mid_epoch(
    fsdp: dict, no_dropout_assets: Path, tmp_path: Path, flags: list[str]  # noqa: F811
) -> None:
    """On one process --fsdp shards nothing: both read the shards of two ranks into the whole model."""
    resume_from(fsdp["output_dir"], tmp_path)
    result = run_python(["-m", f"{PACKAGE}.train", *smoke_flags(no_dropout_assets, tmp_path), *FLAGS, *flags])
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming a run of 2 processes on 1: 2 accumulation steps keep its global batch of 32" in result.stdout
    assert f"at step {RESUMED_AT} (epoch 1, step {RESUMED_AT - STEPS_PER_EPOCH} in it)" in result.stdout
    worst = largest_difference(fsdp["output_dir"], tmp_path, relative=True, skip=NOISE_ONLY)
    assert worst <= RESHAPED_RTOL, f"largest relative weight difference {worst:.3g}"
    resumed = json.loads((tmp_path / "metrics.json").read_text())
    assert resumed["eval_loss"] == pytest.approx(fsdp["metrics"]["eval_loss"], abs=EVAL_LOSS_ATOL)


# ---- the launch scripts: SIGTERM and a killed worker ---------------------------------------------


@pytest.fixture(scope="module")
def stopped(no_dropout_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """The fsdp run's command through scripts/train_single_node.sh, sent SIGTERM after its first checkpoint,
    then started again the same way."""
    output_dir = tmp_path_factory.mktemp("stopped")
    flags, log = [*smoke_flags(no_dropout_assets, output_dir), *FLAGS, *FSDP], output_dir.parent / "stopped.log"
    process = launch(flags, log)
    deadline = time.monotonic() + 240
    while not (output_dir / f"checkpoint-{STEPS_PER_EPOCH // 2}").is_dir():
        assert process.poll() is None, f"ended before its first checkpoint:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, "no first checkpoint after 240 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    returncode, stop_log = wait(process, log, timeout=120), log.read_text()
    resumed_log = output_dir.parent / "resumed.log"
    resumed = wait(launch(flags, resumed_log), resumed_log)
    return {"output_dir": output_dir, "returncode": returncode, "log": stop_log, "resumed": resumed,
            "resumed_log": resumed_log.read_text()}


def test_sigterm_under_fsdp_saves_mid_epoch_and_the_same_command_ends_with_the_undisturbed_weights(
    stopped: dict, fsdp: dict
) -> None:
    assert stopped["returncode"] == STOPPED_EXIT_CODE, stopped["log"][-3000:]
    (reached,) = (int(step) for step in re.findall(r"stopped by SIGTERM at step (\d+), saved in checkpoint-\1",
                                                   stopped["log"]))
    assert STEPS_PER_EPOCH // 2 < reached < TOTAL_STEPS and reached % STEPS_PER_EPOCH, f"step {reached}: not mid-epoch"
    assert [Path(path).name for path in RESUMED_FROM.findall(stopped["resumed_log"])] == [f"checkpoint-{reached}"]
    assert stopped["resumed"] == 0, stopped["resumed_log"][-3000:]
    worst = largest_difference(fsdp["output_dir"], stopped["output_dir"])
    assert worst <= RESUME_ATOL, f"largest weight difference {worst:.3g}"


@pytest.fixture(scope="module")
def restarted(no_dropout_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:  # noqa: F811
    """MAX_RESTARTS=1 and rank 1 killed (SIGKILL) at its first step after the first checkpoint (crash_once.py)."""
    folder = tmp_path_factory.mktemp("restarted")
    output_dir = folder / "output"
    run = run_single_node([*smoke_flags(no_dropout_assets, output_dir), *FLAGS, *FSDP],
                          crash_env(folder, output_dir, "after_checkpoint", crash_rank=1))
    return run | {"output_dir": output_dir, "crashed": (folder / "crashed").exists()}


def test_torchrun_restarts_a_killed_fsdp_worker_and_ends_with_the_undisturbed_weights(restarted: dict,
                                                                                     fsdp: dict) -> None:
    assert restarted["crashed"], "no worker was killed: the test proves nothing"
    assert restarted["returncodes"] == [0], restarted["log"][-4000:]
    assert [Path(path).name for path in RESUMED_FROM.findall(restarted["log"])] == [
        f"checkpoint-{STEPS_PER_EPOCH // 2}"]
    worst = largest_difference(fsdp["output_dir"], restarted["output_dir"])
    assert worst <= RESUME_ATOL, f"largest weight difference {worst:.3g}"


# ---- LoRA, gradient checkpointing, accumulation and bf16 under FSDP ------------------------------


@pytest.fixture(scope="module")
def lora(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A GPT-2-like decoder, as test_models.py's lora run, sharded: bf16 compute (FSDP's MixedPrecisionPolicy)."""
    folder = tmp_path_factory.mktemp("lora")
    gpt2 = make_tiny_decoder("gpt2", folder / "tiny-gpt2", smoke.WORDS)
    output_dir = folder / "out"
    flags = smoke_flags(smoke_assets, output_dir)
    flags[flags.index("--model_name_or_path") + 1] = str(gpt2)
    result = torchrun(["-m", f"{PACKAGE}.train", *flags, *FSDP, "--lora_r", "8", "--gradient_checkpointing", "true",
                       "--per_device_train_batch_size", "8", "--gradient_accumulation_steps", "2",
                       "--num_train_epochs", "6", "--mixed_precision", "bf16", "--do_predict", "true",
                       "--test_file", str(smoke_assets / "validation.jsonl")])
    return {"output_dir": output_dir, "log": result.stdout + result.stderr,
            "metrics": json.loads((output_dir / "metrics.json").read_text())}


def test_lora_with_gradient_checkpointing_and_accumulation_trains_sharded_in_bf16(lora: dict) -> None:
    assert "FSDP: 2 FSDPGPT2Block blocks and the root sharded over 2 ranks, computing in torch.bfloat16" in lora["log"]
    assert lora["metrics"]["eval_accuracy"] > 0.8  # test_models.py's DDP run of the same: 0.89
    assert lora["metrics"]["trainable_parameters"] < lora["metrics"]["total_parameters"] / 2


def test_a_sharded_lora_checkpoint_holds_the_adapters_and_head_not_the_base(lora: dict) -> None:
    newest = sorted(lora["output_dir"].glob("checkpoint-*"), key=lambda path: int(path.name.split("-")[1]))[-1]
    metadata = dcp.FileSystemReader(newest / checkpoint.SHARDED_STATE).read_metadata().state_dict_metadata
    saved = [name.removeprefix("model.") for name in metadata if name.startswith("model.")]
    assert {name for name in saved if ".lora_" not in name} == {"base_model.model.score.modules_to_save.default.weight"}


def test_the_lora_output_dir_loads_in_pipeline_and_merge_lora_as_without_fsdp(lora: dict, tmp_path: Path) -> None:
    """--do_predict ran on the gathered bf16 weights; loaded in fp32 the predictions agree, the scores nearly."""
    output_dir = lora["output_dir"]
    done = read_jsonl(output_dir / "predictions.jsonl")
    classify = pipeline("text-classification", model=str(output_dir), device="cpu")
    piped = classify([row["text"] for row in done])
    agree = sum(row["prediction"] == out["label"] for row, out in zip(done, piped, strict=True))
    assert agree >= len(done) - 2, f"{len(done) - agree} of {len(done)} predictions differ"
    merged = tmp_path / "merged"
    package_module("merge_lora").main(["--model_name_or_path", str(output_dir), "--output_dir", str(merged)])
    merged_piped = pipeline("text-classification", model=str(merged), device="cpu")([row["text"] for row in done])
    assert [out["label"] for out in merged_piped] == [out["label"] for out in piped]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(merged_piped, piped, strict=True)) <= 1e-4


# ---- which models shard, and what is refused -----------------------------------------------------


FAMILIES = {  # tiny configs of every family the project trains (bench/model_families.py), 2 blocks each
    "bert": ("BertConfig", {}), "electra": ("ElectraConfig", {}), "roberta": ("RobertaConfig", {}),
    "deberta-v2": ("DebertaV2Config", {}), "modernbert": ("ModernBertConfig", {}),
    "distilbert": ("DistilBertConfig", {"dim": 64, "n_layers": 2, "n_heads": 2, "hidden_dim": 128}),
    "llama": ("LlamaConfig", {}), "qwen2": ("Qwen2Config", {}),
    "gpt2": ("GPT2Config", {"n_embd": 64, "n_layer": 2, "n_head": 2}),
}
BLOCKS = {"bert": "bert.encoder.layer", "electra": "electra.encoder.layer", "roberta": "roberta.encoder.layer",
          "deberta-v2": "deberta.encoder.layer", "modernbert": "model.layers",
          "distilbert": "distilbert.transformer.layer", "llama": "model.layers", "qwen2": "model.layers",
          "gpt2": "transformer.h"}


@pytest.mark.parametrize("lora_r", [0, 8], ids=["every weight", "LoRA"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_blocks_of_every_family_are_found_from_the_model(family: str, lora_r: int) -> None:
    import transformers

    adapters = package_module("lora")  # a render with include_lora

    name, options = FAMILIES[family]
    size = {} if options else {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
                               "intermediate_size": 128}
    config = getattr(transformers, name)(vocab_size=128, pad_token_id=0, **size, **options)
    with torch.device("meta"):
        model = transformers.AutoModelForSequenceClassification.from_config(config)
        if lora_r:
            model = adapters.wrap_with_lora(model, adapters.LoraArguments("m", lora_r=lora_r))
    blocks = parallel.transformer_blocks(model)
    classifier = adapters.classifier_of(model)
    assert len(blocks) == 2 and blocks is classifier.get_submodule(BLOCKS[family])


def test_fsdp_with_a_ddp_setting_is_refused_in_one_line(smoke_assets: Path, tmp_path: Path) -> None:
    result = run_python(["-m", f"{PACKAGE}.train", *smoke_flags(smoke_assets, tmp_path), *FSDP,
                         "--ddp_find_unused_parameters", "true"])
    assert result.returncode == 2
    assert result.stderr == ("error: --ddp_find_unused_parameters True is a DDP setting, which --fsdp does not use; "
                             "leave it at False or train without --fsdp\n")
