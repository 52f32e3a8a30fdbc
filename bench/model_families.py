"""Which model families train and predict in both loops, with and without LoRA.

    python bench/model_families.py [--families llama,gpt2] [--json bench/results/model_families.json]

Renders the template once per training loop and saves a tiny, randomly initialised checkpoint of
each family with save_pretrained (2 layers of width 64), each beside a tokenizer shaped like the
family's own: WordPiece for BERT, DistilBERT (no token type ids) and ELECTRA; byte-level BPE for
RoBERTa and ModernBERT; a Unigram model for DeBERTa-v2; and the proofs' tiny decoders
(tests/support/tiny_decoders.py) for Llama, Qwen2 and GPT-2, whose tokenizers ship without a pad
token (Llama, GPT-2) or with one their config does not name (Qwen2). Every checkpoint but BERT's is
saved as the family's pretraining model, so the classifier head is new, as when fine-tuning a Hub
checkpoint.

Each row is one family, loop and setting (every weight trained, or --lora_r 8): the rendered
project's scripts/train_single_node.sh on the smoke sentiment data (256 examples, 3 epochs, 2 CPU
processes; the run compares gradients across ranks before its first step and stops if they differ),
with --do_predict on the eval file; then `python -m <package>.predict` from the run's output_dir on
the same file, which must give the same predictions. The table gives the eval accuracy (short runs
on random weights: a check that it learns something, not a quality figure) and the wall time of the
training command.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmark import machine
from workload import PACKAGE, render, smoke_module, tiny_decoders_module

BENCH = Path(__file__).resolve().parent
ENCODERS = ("bert", "distilbert", "roberta", "deberta-v2", "electra", "modernbert")
DECODERS = tiny_decoders_module().DECODERS
SETTINGS = {"every weight": [], "LoRA r=8": ["--lora_r", "8"]}
SIZE = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 128}


def smoke_words(smoke) -> list[str]:
    topic_words = [word for words in smoke.TOPICS.values() for word in words]
    return sorted(set(smoke.POSITIVE + smoke.NEGATIVE + smoke.NEUTRAL + topic_words))


def byte_level_tokenizer(smoke, cls: str, sep: str, pad: str, unk: str, mask: str):
    """A byte-level BPE tokenizer in ModernBERT's shape: [CLS] A [SEP] (B [SEP]), no token type ids."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    vocab, merges = tiny_decoders_module().train_bpe(smoke.WORDS, byte_level=True,
                                                     special_tokens=[cls, sep, pad, unk, mask])
    backend = Tokenizer(models.BPE(vocab=vocab, merges=merges))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.TemplateProcessing(
        single=f"{cls} $A {sep}", pair=f"{cls} $A {sep} $B {sep}",
        special_tokens=[(cls, vocab[cls]), (sep, vocab[sep])])
    return PreTrainedTokenizerFast(tokenizer_object=backend, cls_token=cls, sep_token=sep, pad_token=pad,
                                   unk_token=unk, mask_token=mask, model_max_length=128,
                                   model_input_names=["input_ids", "attention_mask"])


def save_encoder(smoke, family: str, folder: Path) -> None:
    import torch
    import transformers as t

    torch.manual_seed(0)
    wordpiece = smoke.build_tokenizer()  # the smoke BERT's: [PAD] [UNK] [CLS] [SEP] [MASK] and the words
    if family in ("bert", "electra"):
        tokenizer = wordpiece  # ELECTRA ships a BERT tokenizer
        config_class, model_class = (t.BertConfig, t.BertForSequenceClassification) if family == "bert" else (
            t.ElectraConfig, t.ElectraForPreTraining)
        model = model_class(config_class(vocab_size=len(tokenizer), max_position_embeddings=128, **SIZE))
    elif family == "distilbert":
        tokenizer = t.DistilBertTokenizer(vocab=wordpiece.get_vocab(), model_max_length=128)
        model = t.DistilBertForMaskedLM(t.DistilBertConfig(vocab_size=len(tokenizer), dim=64, n_layers=2, n_heads=2,
                                                           hidden_dim=128, max_position_embeddings=128))
    elif family == "roberta":
        vocab, merges = tiny_decoders_module().train_bpe(smoke.WORDS, byte_level=True,
                                                         special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
        tokenizer = t.RobertaTokenizer(vocab=vocab, merges=merges, model_max_length=128)
        model = t.RobertaForMaskedLM(t.RobertaConfig(vocab_size=len(tokenizer), pad_token_id=tokenizer.pad_token_id,
                                                     bos_token_id=0, eos_token_id=2, max_position_embeddings=130,
                                                     type_vocab_size=1, **SIZE))
    elif family == "deberta-v2":
        specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
        pieces = [("\u2581" + word, -1.0) for word in smoke_words(smoke)]
        letters = sorted({letter for word in smoke_words(smoke) for letter in word} | {"\u2581"})
        tokenizer = t.DebertaV2Tokenizer(vocab=[(token, 0.0) for token in specials] + pieces +
                                         [(letter, -5.0) for letter in letters], model_max_length=128)
        model = t.DebertaV2ForMaskedLM(t.DebertaV2Config(vocab_size=len(tokenizer), max_position_embeddings=128,
                                                         pad_token_id=tokenizer.pad_token_id, **SIZE))
    elif family == "modernbert":
        tokenizer = byte_level_tokenizer(smoke, "[CLS]", "[SEP]", "[PAD]", "[UNK]", "[MASK]")
        model = t.ModernBertForMaskedLM(t.ModernBertConfig(
            vocab_size=len(tokenizer), max_position_embeddings=128, pad_token_id=tokenizer.pad_token_id,
            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id, **SIZE))
    else:
        raise SystemExit(f"error: no tiny {family}; choose from {', '.join(ENCODERS + DECODERS)}")
    tokenizer.save_pretrained(folder)
    model.save_pretrained(folder)


def run(command: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHON=sys.executable, NPROC_PER_NODE="2", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1",
               HF_DATASETS_OFFLINE="1", CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(cwd / "src"))
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


def try_row(project: Path, model: Path, assets: Path, output_dir: Path, flags: list[str]) -> dict:
    eval_file = str(assets / "validation.jsonl")
    started = time.perf_counter()
    trained = run([str(project / "scripts" / "train_single_node.sh"), "configs/smoke.yaml",
                   "--model_name_or_path", str(model), "--train_file", str(assets / "train.jsonl"),
                   "--validation_file", eval_file, "--num_train_epochs", "3", "--do_predict", "true",
                   "--test_file", eval_file, "--output_dir", str(output_dir), "--disable_tqdm", "true", *flags],
                  project)
    wall = time.perf_counter() - started
    if trained.returncode != 0:
        log = (trained.stdout + trained.stderr).splitlines()
        errors = [line for line in log if re.search(r"(\w+(Error|Exception): |^error: )", line)]
        return {"trained": False, "wall_s": wall, "error": (errors or [f"exit status {trained.returncode}"])[0][:300],
                "log_tail": log[-60:]}
    metrics = json.loads((output_dir / "metrics.json").read_text())
    again = output_dir.parent / f"{output_dir.name}-again.jsonl"
    predicted = run([sys.executable, "-m", f"{PACKAGE}.predict", "--model_name_or_path", str(output_dir),
                     "--input_file", eval_file, "--output_file", str(again)], project)
    done = [json.loads(line) for line in (output_dir / "predictions.jsonl").read_text().splitlines()]
    redone = [json.loads(line) for line in again.read_text().splitlines()] if predicted.returncode == 0 else []
    same = len(redone) == len(done) and all(
        a["prediction"] == b["prediction"] and abs(a["score"] - b["score"]) < 1e-5 for a, b in zip(done, redone,
                                                                                                    strict=True))
    return {"trained": True, "wall_s": wall, "eval_accuracy": metrics["eval_accuracy"],
            "trainable_parameters": metrics["trainable_parameters"], "total_parameters": metrics["total_parameters"],
            "predictions": len(done), "predict_from_output_dir_agrees": same}


def markdown(rows: list[dict]) -> str:
    lines = ["| Family | Loop | Setting | Trains | Eval accuracy | Trainable / total parameters | predict.py agrees "
             "| Wall (s) |", "|---|---|---|---|---:|---:|---|---:|"]
    for row in rows:
        if not row["trained"]:
            lines.append(f"| {row['family']} | {row['loop']} | {row['setting']} | no: {row['error']} | | | "
                         f"| {row['wall_s']:.0f} |")
            continue
        lines.append(f"| {row['family']} | {row['loop']} | {row['setting']} | yes | {row['eval_accuracy']:.3f} "
                     f"| {row['trainable_parameters']:,} / {row['total_parameters']:,} "
                     f"| {'yes' if row['predict_from_output_dir_agrees'] else 'NO'} | {row['wall_s']:.0f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(ENCODERS + DECODERS))
    parser.add_argument("--json", type=Path, default=BENCH / "results" / "model_families.json")
    args = parser.parse_args()
    families = args.families.split(",")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench_families_") as scratch:
        scratch = Path(scratch)
        projects = {loop: render(scratch / loop, training_loop=loop, include_lora=True)  # for the LoRA rows
                    for loop in ("native", "trainer")}
        smoke = smoke_module(projects["native"])
        assets = smoke.make_smoke_assets(scratch / "assets", train_size=256, eval_size=101)
        for family in families:
            folder = scratch / "models" / family
            if family in DECODERS:
                tiny_decoders_module().make_tiny_decoder(family, folder, smoke.WORDS)
            else:
                save_encoder(smoke, family, folder)
            for loop, project in projects.items():
                for setting, flags in SETTINGS.items():
                    output_dir = scratch / "runs" / f"{family}-{loop}-{len(flags)}"
                    row = {"family": family, "loop": loop, "setting": setting,
                           **try_row(project, folder, assets, output_dir, flags)}
                    rows.append(row)
                    print(markdown([row]).splitlines()[-1], file=sys.stderr, flush=True)
    host = machine()
    today = datetime.date.today().isoformat()
    print(f"{today}, {host['cpu_cores']} CPU cores ({host['cpu_model']}), no GPU; torch {host['torch']}, transformers "
          f"{host['transformers']}\n")
    print(markdown(rows))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps({"date": today, "machine": host, "rows": rows}, indent=1) + "\n")
    print(f"JSON written to {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
