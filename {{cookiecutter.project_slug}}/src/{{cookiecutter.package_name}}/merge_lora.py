"""Merge a LoRA run's adapters into its base weights: a plain checkpoint, which loads without peft.

    python -m <package>.merge_lora --model_name_or_path OUTPUT_DIR --output_dir MERGED_DIR

OUTPUT_DIR is a run's output_dir, which holds the adapters and the head next to the frozen base
(lora.save_base). MERGED_DIR gets one model of the base's architecture, whose linear layers
hold W + (alpha / r) BA, with the trained head and the tokenizer: it predicts as OUTPUT_DIR does (to
float rounding) and as fast as a model trained without LoRA.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING, AutoConfig, AutoTokenizer, HfArgumentParser

from .config import ConfigError, check_local_path, parse_flags
from .distributed import exit_on_config_error
from .lora import ADAPTER_CONFIG, quiet_peft
from .modeling import LOAD_OPTIONS


@dataclass
class MergeArguments:
    model_name_or_path: str = field(metadata={"help": "A LoRA run's output_dir."})
    output_dir: str = field(metadata={"help": "Where to write the merged model and its tokenizer."})


def merge_lora(source: str, destination: str) -> Path:
    from peft import PeftModel

    check_local_path(source)
    if Path(destination).resolve() == Path(source).resolve():  # the adapters left there would apply twice
        raise ConfigError(f"--output_dir {destination!r} is the LoRA run's folder: write elsewhere")
    if not Path(source, ADAPTER_CONFIG).is_file() or not Path(source, "config.json").is_file():
        raise ConfigError(f"--model_name_or_path {source!r} is not a LoRA run's output_dir: it needs {ADAPTER_CONFIG} "
                          "and config.json (a checkpoint-N holds no base; a run without LoRA has nothing to merge)")
    config = AutoConfig.from_pretrained(source)
    # From its folder's path transformers would load the base with the adapter already attached (its own
    # peft integration), which peft cannot merge: load the weights alone, then attach the adapter with peft.
    model_class = MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING[type(config)]
    base = model_class.from_pretrained(None, config=config, state_dict=read_weights(Path(source)), **LOAD_OPTIONS)
    with quiet_peft():
        merged = PeftModel.from_pretrained(base, source).merge_and_unload()
    merged.save_pretrained(destination)
    AutoTokenizer.from_pretrained(source).save_pretrained(destination)
    return Path(destination)


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    import safetensors.torch

    index = folder / "model.safetensors.index.json"
    files = ["model.safetensors"]
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    return {key: value for name in files for key, value in safetensors.torch.load_file(folder / name).items()}


def main(argv: list[str] | None = None) -> None:
    parser = HfArgumentParser(MergeArguments, prog=f"python -m {__package__}.merge_lora")
    with exit_on_config_error():
        (args,) = parse_flags(parser, argv)
        path = merge_lora(args.model_name_or_path, args.output_dir)
    print(f"merged model written to {path}/")


if __name__ == "__main__":
    main()
