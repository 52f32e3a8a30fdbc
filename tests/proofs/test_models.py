"""Any classifier a user picks: decoders without a pad token, LoRA adapters and gradient checkpointing.

In-process tests first: padding (a pad token for decoders that ship without one, on the right, the
same logits alone and in a batch), the preflight's refusals and how LoRA wraps a model. Then three
real runs under torchrun (2 CPU processes, gloo, tests/ddp_probe.py), each shared by many tests:

- lora: a GPT-2-like decoder (no pad token) with LoRA, gradient checkpointing and 2 accumulation
  steps; the same command also stopped by SIGTERM and started again;
- pairs: a Llama-like decoder (no pad token, padding on the left as shipped) on sentence pairs, every
  weight trained, with gradient checkpointing;
- encoder: the smoke BERT with LoRA, without gradient checkpointing;
- unused: a BigBird whose classification forward never uses its pooler (conftest.tiny_bigbird), every
  other weight trained, with gradient checkpointing: the pooler is frozen and named in one log line.

The tiny decoders come from tiny_decoders.make_tiny_decoder (a proof helper): built from configs, offline.
"""

from __future__ import annotations

import json
import logging
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from conftest import (
    EVAL_SIZE,
    IS_NATIVE,
    PACKAGE,
    REPO_ROOT,
    SMOKE,
    SMOKE_CONFIG,
    TRAIN_SIZE,
    package_module,
    read_jsonl,
    read_probe,
    smoke_flags,
)
from datasets import Dataset, DatasetDict
from safetensors.torch import load_file
from tiny_decoders import DECODERS, build_decoder_tokenizer, make_tiny_decoder, train_bpe
from transformers import AutoConfig, pipeline
from warm_launch import run_python, start_torchrun, torchrun

config = package_module("config")
data = package_module("data")
lora = package_module("lora")  # a render with include_lora
modeling = package_module("modeling")
predict = package_module("predict")
smoke = package_module("smoke")

PROBE = str(REPO_ROOT / "tests" / "ddp_probe.py")
# 2 ranks x 8 examples x 2 accumulation steps: the smoke run's global batch of 32, in micro-batches.
LORA_EPOCHS = 6
LORA_FLAGS = ["--lora_r", "8", "--gradient_checkpointing", "true", "--per_device_train_batch_size", "8",
              "--gradient_accumulation_steps", "2", "--num_train_epochs", str(LORA_EPOCHS)]
STEPS_PER_EPOCH = TRAIN_SIZE // (2 * SMOKE["per_device_train_batch_size"])
TOTAL_STEPS = STEPS_PER_EPOCH * LORA_EPOCHS
# LoRA trains the adapters of a frozen body, here a randomly initialised one. Measured: the smoke BERT
# reached 0.75 (native loop) and 0.81 (Trainer) with them, the GPT-2-like decoder 0.89 and 0.86, the
# Llama-like one on pairs 1.0 with every weight trained, the BigBird without its pooler 0.90 in both loops.
MIN_ACCURACY = {"lora_run": 0.8, "pairs_run": 0.8, "encoder_run": 0.7, "unused_run": 0.8}
RESUME_ATOL = 1e-6  # resuming replays the same operations: as in test_preemption.py
PADDING_ATOL = 1e-5


def model_args(folder: Path, **options) -> object:
    return lora.LoraArguments(model_name_or_path=str(folder), **options)


def single_label(text_pair_column: str | None = None) -> object:
    return data.Task("single_label_classification", ["negative", "positive"], text_pair_column=text_pair_column)


@pytest.fixture(scope="module")
def decoders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("decoders")
    return {family: make_tiny_decoder(family, folder / f"tiny-{family}", smoke.WORDS) for family in DECODERS}


def model_folder(name: str, decoders: dict[str, Path], smoke_assets: Path) -> Path:
    return smoke_assets / "tiny-bert" if name == "bert" else decoders[name]


# ---- padding ----------------------------------------------------------------------------------


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_a_tokenizer_without_a_pad_token_pads_with_its_eos_token_on_the_right(
    family: str, decoders: dict[str, Path], caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    shipped = build_decoder_tokenizer(family, smoke.WORDS)
    assert shipped.pad_token is None  # as the family ships it: otherwise this proves nothing
    with caplog.at_level(logging.INFO):
        tokenizer = modeling.load_tokenizer(model_args(decoders[family]))
    assert (tokenizer.pad_token, tokenizer.padding_side) == (tokenizer.eos_token, "right")
    assert f"has no pad token: padding with its eos token {tokenizer.eos_token!r}" in caplog.text
    tokenizer.save_pretrained(tmp_path)  # as a run saves it with the model: predict and pipeline read this
    reloaded = type(tokenizer).from_pretrained(tmp_path)
    assert (reloaded.pad_token, reloaded.padding_side) == (tokenizer.eos_token, "right")


@pytest.mark.parametrize("family", ["llama", "qwen2", "gpt2"])
def test_the_model_config_takes_the_tokenizers_pad_token(family: str, decoders: dict[str, Path]) -> None:
    """Qwen2's tokenizer has a pad token that its config does not name: the head needs it there."""
    assert json.loads((decoders[family] / "config.json").read_text()).get("pad_token_id") is None
    tokenizer = modeling.load_tokenizer(model_args(decoders[family]))
    model = modeling.load_model(model_args(decoders[family]), single_label(), tokenizer)
    assert model.config.pad_token_id == tokenizer.pad_token_id is not None


def padded_logits(model, tokenizer, task, rows: list[dict]) -> torch.Tensor:
    """Logits of rows tokenised as training tokenises them (data.encode) and padded by the training collator."""
    encoded = data.tokenize_datasets(DatasetDict(rows=Dataset.from_list(rows)), tokenizer, task)["rows"]
    batch = data.build_collator(tokenizer, mixed_precision=False)(list(encoded))
    with torch.no_grad():
        return model(**batch).logits


def invariance_case(name: str, pairs: bool, decoders: dict[str, Path], smoke_assets: Path, lora: bool = False):
    folder = model_folder(name, decoders, smoke_assets)
    task = single_label("pair" if pairs else None)
    tokenizer = modeling.load_tokenizer(model_args(folder))
    model = modeling.load_model(model_args(folder, ignore_mismatched_sizes=True, lora_r=8 if lora else 0), task,
                                tokenizer).eval()
    short = {"text": "a good film", "pair": "superb"}
    longer = [{"text": " ".join(["the plot was boring and the cast was weak"] * count), "pair": "dull and tedious"}
              for count in (2, 5)]
    rows = [{key: row[key] for key in (("text", "pair") if pairs else ("text",))} for row in [short, *longer]]
    return model, tokenizer, task, rows


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pairs"])
@pytest.mark.parametrize("name, lora", [("llama", False), ("llama", True), ("qwen2", False), ("gpt2", False),
                                        ("bert", False)], ids=["llama", "llama-lora", "qwen2", "gpt2", "bert"])
def test_an_example_gives_the_same_logits_alone_and_padded_in_a_batch(
    name: str, lora: bool, pairs: bool, decoders: dict[str, Path], smoke_assets: Path
) -> None:
    model, tokenizer, task, rows = invariance_case(name, pairs, decoders, smoke_assets, lora)
    batched = padded_logits(model, tokenizer, task, rows)
    alone = padded_logits(model, tokenizer, task, rows[:1])
    lengths = [len(tokenizer(row["text"], row.get("pair"))["input_ids"]) for row in rows]
    assert lengths[0] < lengths[1] < lengths[2]  # the first row is padded in the batch
    torch.testing.assert_close(batched[0], alone[0], rtol=0, atol=PADDING_ATOL)
    assert batched[0].argmax() == alone[0].argmax()


def test_padding_gpt2_on_the_left_would_change_its_logits(decoders: dict[str, Path], smoke_assets: Path) -> None:
    """The test above can fail: GPT-2's learned positions see a left-padded example elsewhere."""
    model, tokenizer, task, rows = invariance_case("gpt2", False, decoders, smoke_assets)
    tokenizer.padding_side = "left"
    difference = (padded_logits(model, tokenizer, task, rows)[0] - padded_logits(model, tokenizer, task, rows[:1])[0])
    assert difference.abs().max() > 100 * PADDING_ATOL


# ---- refusals ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("options", "message"), [
    ({"lora_r": -1}, r"^--lora_r -1: must be >= 0 \(0 trains every weight, without LoRA\)$"),
    ({"lora_alpha": 0}, r"^--lora_alpha 0: must be > 0$"),
    ({"lora_dropout": 1.0}, r"^--lora_dropout 1.0: must be from 0 up to \(not including\) 1$"),
    ({"lora_target_modules": " , "}, "^--lora_target_modules is empty: pass all-linear or layer names"),
], ids=["r", "alpha", "dropout", "targets"])
def test_bad_lora_settings_are_refused(options: dict, message: str) -> None:
    with pytest.raises(config.ConfigError, match=message):
        lora.LoraArguments(model_name_or_path="m", **options)


def test_lora_target_modules_must_name_linear_layers_of_the_model(decoders: dict[str, Path]) -> None:
    expected = ("--lora_target_modules q_proj,attn: llama has no linear layer named attn; its linear layers are "
                "named down_proj, gate_proj, k_proj, o_proj, q_proj, up_proj, v_proj (or pass all-linear)")
    with pytest.raises(config.ConfigError, match=f"^{expected.replace('(', '.').replace(')', '.')}$"):
        modeling.check_model_settings(model_args(decoders["llama"], lora_r=8, lora_target_modules="q_proj,attn"),
                                      gradient_checkpointing=True)


def preflight(flags: list[str]) -> subprocess.CompletedProcess:
    return run_python(["-m", f"{PACKAGE}.preflight", *flags], timeout=120)


@pytest.mark.slow
def test_preflight_refuses_a_tokenizer_with_nothing_to_pad_with_in_one_line(
    decoders: dict[str, Path], smoke_assets: Path, tmp_path: Path
) -> None:
    folder = tmp_path / "no-eos"
    vocab, merges = train_bpe(smoke.WORDS, byte_level=True, special_tokens=[])
    type(build_decoder_tokenizer("gpt2", smoke.WORDS))(vocab=vocab, merges=merges, bos_token=None, eos_token=None,
                                                       unk_token=None).save_pretrained(folder)
    for name in ("config.json", "model.safetensors"):
        (folder / name).write_bytes((decoders["gpt2"] / name).read_bytes())
    flags = smoke_flags(smoke_assets, tmp_path / "out")
    flags[flags.index("--model_name_or_path") + 1] = str(folder)
    result = preflight(flags)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines() == [
        f"error: the tokenizer of {str(folder)!r} has neither a pad token nor an eos token to pad with; pass "
        "--tokenizer_name with a tokenizer that has one of them"]


def test_gradient_checkpointing_with_ddps_unused_parameter_search_is_refused() -> None:
    flags = ["--model_name_or_path", "m", "--train_file", "t.jsonl", "--gradient_checkpointing", "true",
             "--ddp_find_unused_parameters", "true", "--use_cpu", "true"]
    with pytest.raises(config.ConfigError, match="^--gradient_checkpointing with --ddp_find_unused_parameters "
                                                 "true fails in DDP"):
        config.parse_args(package_module("training_args").TrainingArguments, flags)


# ---- how LoRA wraps a model -----------------------------------------------------------------


@pytest.mark.parametrize(("name", "head", "layers"), [
    ("bert", {"classifier"}, {"query", "key", "value", "dense"}),
    ("llama", {"score"}, {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}),
    ("gpt2", {"score"}, {"c_attn", "c_proj", "c_fc"}),
])
def test_lora_adapts_every_linear_layer_of_the_body_and_trains_the_whole_head(
    name: str, head: set, layers: set, decoders: dict[str, Path], smoke_assets: Path
) -> None:
    folder = model_folder(name, decoders, smoke_assets)
    model = modeling.load_model(model_args(folder, lora_r=4), single_label(), modeling.load_tokenizer(
        model_args(folder)))
    classifier = lora.classifier_of(model)
    body = classifier.get_submodule(classifier.base_model_prefix)
    assert set(lora.head_modules(classifier)) == head
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    adapted = {n.split(".lora_")[0].rpartition(".")[2] for n in trainable if ".lora_" in n}
    assert adapted == layers
    head_copies = {n for n in trainable if ".modules_to_save." in n}
    assert trainable == head_copies | {n for n in trainable if ".lora_" in n}
    assert {n.split(".modules_to_save.")[0].rpartition(".")[2] for n in head_copies} == head
    assert not any(p.requires_grad for n, p in body.named_parameters() if ".lora_" not in n)
    counts = modeling.parameter_counts(model)
    assert counts["trainable_parameters"] == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert counts["trainable_parameters"] < counts["total_parameters"] / 2


def test_lora_target_modules_picks_those_layers_only(decoders: dict[str, Path]) -> None:
    model = modeling.load_model(model_args(decoders["llama"], lora_r=4, lora_target_modules="q_proj,v_proj"),
                                single_label(), modeling.load_tokenizer(model_args(decoders["llama"])))
    adapted = {n.split(".lora_")[0] for n, _ in model.named_parameters() if ".lora_" in n}
    assert adapted == {f"base_model.model.model.layers.{i}.self_attn.{p}" for i in (0, 1) for p in ("q_proj", "v_proj")}


# ---- three runs under torchrun --------------------------------------------------------------


def flags_for(smoke_assets: Path, model: Path, *extra: str, task: str = "") -> list[str]:
    """configs/smoke.yaml on the model and on the task's files (smoke_assets/<task>/), predicting the eval file."""
    files = smoke_assets / task
    return [str(SMOKE_CONFIG), "--model_name_or_path", str(model), "--train_file", str(files / "train.jsonl"),
            "--validation_file", str(files / "validation.jsonl"), "--do_predict", "true", "--test_file",
            str(files / "validation.jsonl"), "--disable_tqdm", "true", *extra]


def run(output_dir: Path, flags: list[str]) -> dict:
    result = torchrun([PROBE, *flags, "--output_dir", str(output_dir)])
    return {"output_dir": output_dir, "records": read_probe(output_dir), "log": result.stdout + result.stderr,
            "metrics": json.loads((output_dir / "metrics.json").read_text())}


@pytest.fixture(scope="module")
def lora_flags(decoders: dict[str, Path], smoke_assets: Path) -> list[str]:
    return flags_for(smoke_assets, decoders["gpt2"], *LORA_FLAGS)


@pytest.fixture(scope="module")
def lora_run(lora_flags: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run(tmp_path_factory.mktemp("lora"), lora_flags)


@pytest.fixture(scope="module")
def stopped_and_resumed(lora_flags: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """The lora run's command, sent SIGTERM after its first checkpoint, then started again."""
    output_dir = tmp_path_factory.mktemp("stopped")
    process = start_torchrun([PROBE, *lora_flags, "--output_dir", str(output_dir)])
    deadline = time.monotonic() + 240
    while not (output_dir / f"checkpoint-{STEPS_PER_EPOCH}").is_dir():
        assert process.poll() is None, f"ended before its first checkpoint:\n{process.finish().stderr[-3000:]}"
        assert time.monotonic() < deadline, "no first checkpoint after 240 s"
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)  # torchrun passes it on to its workers, as under a scheduler
    stopped = process.finish(timeout=120)
    checkpoints = sorted(int(path.name.split("-")[1]) for path in output_dir.glob("checkpoint-*"))
    return {"stopped": stopped, "checkpoints": checkpoints, **run(output_dir, lora_flags)}


@pytest.fixture(scope="module")
def pairs_run(decoders: dict[str, Path], smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run(tmp_path_factory.mktemp("pairs"), flags_for(
        smoke_assets, decoders["llama"], "--text_column", "sentence1", "--text_pair_column", "sentence2",
        "--gradient_checkpointing", "true", "--num_train_epochs", "6", task="pairs"))


@pytest.fixture(scope="module")
def encoder_run(smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    return run(tmp_path_factory.mktemp("encoder"), flags_for(smoke_assets, smoke_assets / "tiny-bert", "--lora_r", "8",
                                                             "--learning_rate", "0.01"))


@pytest.fixture(scope="module")
def unused_run(tiny_bigbird: Path, smoke_assets: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Gradient checkpointing rules out DDP's own search for unused parameters: freezing them is the way."""
    return run(tmp_path_factory.mktemp("unused"), flags_for(smoke_assets, tiny_bigbird, "--gradient_checkpointing",
                                                            "true"))


RUNS = ["lora_run", "pairs_run", "encoder_run", "unused_run"]


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_ranks_end_with_identical_weights(name: str, request: pytest.FixtureRequest) -> None:
    probe = request.getfixturevalue(name)["output_dir"] / "probe"
    rank0, rank1 = load_file(probe / "rank0.safetensors"), load_file(probe / "rank1.safetensors")
    assert rank0.keys() == rank1.keys()
    assert [key for key in rank0 if not torch.equal(rank0[key], rank1[key])] == []


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_it_learns(name: str, request: pytest.FixtureRequest) -> None:
    chosen = request.getfixturevalue(name)
    losses = chosen["records"][0]["logged_losses"]
    assert losses[-1] < 0.8 * losses[0]
    assert chosen["metrics"]["eval_accuracy"] > MIN_ACCURACY[name]
    assert chosen["metrics"]["eval_num_examples"] == EVAL_SIZE


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_ddp_all_reduces_exactly_the_trainable_parameters(name: str, request: pytest.FixtureRequest) -> None:
    chosen = request.getfixturevalue(name)
    trainable, total = (chosen["metrics"][key] for key in ("trainable_parameters", "total_parameters"))
    assert [record["ddp_parameter_bytes"] for record in chosen["records"]] == [4 * trainable] * 2  # fp32
    assert chosen["log"].count(f"parameters: {trainable} trainable of {total} (") == 1  # rank 0's
    if name == "pairs_run":
        assert trainable == total
    elif name == "unused_run":  # all but the pooler's 64 x 64 weights and 64 biases
        assert trainable == total - 64 * 64 - 64
    else:
        assert trainable < total / 2


@pytest.mark.slow
def test_unused_parameters_are_named_in_one_line_frozen_and_left_as_loaded(
    unused_run: dict, tiny_bigbird: Path
) -> None:
    assert unused_run["log"].count("froze ") == 1  # rank 0's one line
    assert ("froze 2 parameter tensor(s) (bert.pooler.weight, bert.pooler.bias): the classification forward never "
            "uses them") in unused_run["log"]
    initial = load_file(tiny_bigbird / "model.safetensors")
    trained = load_file(unused_run["output_dir"] / "probe" / "rank0.safetensors")
    assert torch.equal(trained["bert.pooler.weight"], initial["bert.pooler.weight"])
    assert not torch.equal(trained["bert.encoder.layer.0.attention.self.query.weight"],
                           initial["bert.encoder.layer.0.attention.self.query.weight"])


@pytest.mark.slow
def test_lora_leaves_the_base_weights_as_they_were(lora_run: dict, decoders: dict[str, Path]) -> None:
    trained = load_file(lora_run["output_dir"] / "probe" / "rank0.safetensors")
    initial = load_file(decoders["gpt2"] / "model.safetensors")
    layer = "transformer.h.0.attn.c_attn"
    assert torch.equal(trained[f"base_model.model.{layer}.base_layer.weight"], initial[f"{layer}.weight"])
    # LoRA's B matrices start at zero: a nonzero one trained, through the checkpointed layer.
    assert trained[f"base_model.model.{layer}.lora_B.default.weight"].abs().max() > 0


@pytest.mark.slow
def test_a_lora_checkpoint_holds_the_adapters_and_head_not_the_base(lora_run: dict) -> None:
    checkpoint = lora_run["output_dir"] / f"checkpoint-{TOTAL_STEPS}"
    names = {path.name for path in checkpoint.iterdir()}
    assert "model.safetensors" not in names and "adapter_config.json" in names
    if IS_NATIVE:  # the trainable tensors and their AdamW state, through torch.distributed.checkpoint
        metadata = dcp.FileSystemReader(checkpoint / "model_and_optimizer").read_metadata().state_dict_metadata
        saved = [name.removeprefix("model.") for name in metadata if name.startswith("model.")]
        head = "base_model.model.score.modules_to_save.default.weight"  # peft's trainable copy of the head
    else:
        saved, head = load_file(checkpoint / "adapter_model.safetensors"), "base_model.model.score.weight"
    assert {key for key in saved if ".lora_" not in key} == {head}


@pytest.mark.slow
def test_a_stopped_lora_run_resumes_where_it_stopped_and_ends_with_the_uninterrupted_weights(
    lora_run: dict, stopped_and_resumed: dict
) -> None:
    first, stopped_at = stopped_and_resumed["checkpoints"][0], stopped_and_resumed["checkpoints"][-1]
    assert stopped_and_resumed["stopped"].returncode != 0, "the run ended before the signal"
    assert first == STEPS_PER_EPOCH < stopped_at < TOTAL_STEPS
    records = stopped_and_resumed["records"]
    expected_from = str(stopped_and_resumed["output_dir"] / f"checkpoint-{stopped_at}")
    assert [record["resumed_from"] for record in records] == [expected_from] * 2
    assert [record["steps_run"] for record in records] == [TOTAL_STEPS - stopped_at] * 2
    expected, actual = (load_file(run["output_dir"] / "probe" / "rank0.safetensors")
                        for run in (lora_run, stopped_and_resumed))
    worst = max((expected[name] - actual[name]).abs().max().item() for name in expected)
    assert worst <= RESUME_ATOL


# ---- what output_dir holds: predict, pipeline, merge ----------------------------------------


def predict_again(model_dir: Path, done: list[dict], tmp_path: Path) -> list[dict]:
    """predict.py's predictions from model_dir for the rows --do_predict predicted."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({key: value for key, value in row.items() if key not in ("prediction", "score")})
                            + "\n" for row in done))
    cpu = torch.device("cpu")
    model, tokenizer, task = predict.load_trained_model(str(model_dir), cpu)
    assert model.use_kernels is False  # modeling.LOAD_OPTIONS: on CUDA, eval() would fetch a Hub kernel
    path = predict.predict_file(model, tokenizer, task, str(rows), str(tmp_path / "again.jsonl"), 16, cpu)
    return read_jsonl(path)


def assert_same_predictions(expected: list[dict], actual: list[dict], atol: float) -> None:
    assert [row["prediction"] for row in actual] == [row["prediction"] for row in expected]
    assert max(abs(a["score"] - b["score"]) for a, b in zip(actual, expected, strict=True)) <= atol


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_output_dir_predicts_as_do_predict_did(name: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    output_dir = request.getfixturevalue(name)["output_dir"]
    done = read_jsonl(output_dir / "predictions.jsonl")
    assert len(done) == EVAL_SIZE
    assert_same_predictions(done, predict_again(output_dir, done, tmp_path), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", RUNS)
def test_transformers_pipeline_loads_output_dir_and_predicts_the_same(name: str, request: pytest.FixtureRequest
                                                                      ) -> None:
    output_dir = request.getfixturevalue(name)["output_dir"]
    done = read_jsonl(output_dir / "predictions.jsonl")[:16]
    task = data.Task.from_config(AutoConfig.from_pretrained(output_dir))
    classify = pipeline("text-classification", model=str(output_dir), device="cpu")
    inputs = [{"text": row[task.text_column], "text_pair": row[task.text_pair_column]} if task.text_pair_column
              else row[task.text_column] for row in done]
    assert_same_predictions(done, [{"prediction": out["label"], "score": out["score"]} for out in classify(inputs)],
                            atol=1e-5)


@pytest.mark.slow
def test_the_merge_command_writes_a_plain_model_that_predicts_the_same(lora_run: dict, tmp_path: Path) -> None:
    merged = tmp_path / "merged"
    package_module("merge_lora").main(["--model_name_or_path", str(lora_run["output_dir"]),
                                       "--output_dir", str(merged)])
    names = {path.name for path in merged.iterdir()}
    assert "model.safetensors" in names and not {name for name in names if name.startswith("adapter")}
    done = read_jsonl(lora_run["output_dir"] / "predictions.jsonl")
    # W + (alpha / r) BA sums in another order than W x + (alpha / r) B (A x): float rounding.
    assert_same_predictions(done, predict_again(merged, done, tmp_path), atol=1e-4)


@pytest.mark.slow
def test_merge_refuses_the_run_folder_itself_and_both_commands_refuse_an_unknown_flag(
        lora_run: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    source, merge_lora = lora_run["output_dir"], package_module("merge_lora")
    weights = (source / "model.safetensors").read_bytes()
    with pytest.raises(config.ConfigError, match="is the LoRA run's folder: write elsewhere"):
        merge_lora.merge_lora(str(source), f"{source}/.")  # the adapters left there would apply twice
    assert (source / "model.safetensors").read_bytes() == weights
    files = ["--input_file", str(tmp_path / "in.csv"), "--output_file", str(tmp_path / "out.csv")]
    for module, flags in ((merge_lora, ["--output_dir", str(tmp_path)]), (predict, files)):
        with pytest.raises(SystemExit) as refusal:
            module.main(["--model_name_or_path", str(source), *flags, "--bogus", "1"])
        assert refusal.value.code == 2
        assert "error: unrecognized arguments: --bogus 1" in capsys.readouterr().err


@pytest.mark.slow
def test_predict_refuses_a_lora_checkpoint_without_its_base(lora_run: dict) -> None:
    checkpoint = str(lora_run["output_dir"] / f"checkpoint-{TOTAL_STEPS}")
    with pytest.raises(config.ConfigError, match="holds a LoRA adapter without its base"):
        predict.load_trained_model(checkpoint, torch.device("cpu"))
