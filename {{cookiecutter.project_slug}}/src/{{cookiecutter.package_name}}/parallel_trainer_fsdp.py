"""How the Trainer spreads the model over the processes: DDP, or with --fsdp FSDP2 from transformers'
fsdp_config (GPUs only); accelerate wraps the model either way. train.py calls only this module (as
torchtitan's trainer its parallelize_fn), and training_args.TrainingArguments takes --fsdp from it."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch.distributed.fsdp import FSDPModule
from transformers import TrainerCallback

#% if cookiecutter.include_lora
from . import lora
#% endif
from .config import ConfigError
from .distributed import assert_gradients_synchronised

if TYPE_CHECKING:  # training_args imports this module
    from .training_args import TrainingArguments

logger = logging.getLogger(__name__)
# What --fsdp true sets transformers' fsdp_config to, unless --fsdp_config gives one: FSDP2, each transformer
# block sharded on its own (the block class is named once the model is loaded: shard_blocks_of), its weights
# resharded after its forward, and whole weights gathered for every save, so that checkpoints and output_dir
# load as without FSDP.
FSDP2 = {"version": 2, "auto_wrap_policy": "TRANSFORMER_BASED_WRAP", "reshard_after_forward": True,
         "state_dict_type": "FULL_STATE_DICT", "cpu_ram_efficient_loading": False}


@dataclass
class ParallelArguments:
    # transformers 5 types its own fsdp as a string of options, and warns that strings are deprecated: here it
    # is true or false, as in the native loop.
    fsdp: bool = field(default=False, metadata={"help": "Shard weights, grads, AdamW (FSDP2); GPUs only."})

    def check_parallel_settings(self) -> None:
        """Once the device is decided, before transformers reads fsdp_config: refused on CPU; else FSDP2."""
        if not self.fsdp:
            return
        if self.device_settings.use_cpu:  # accelerate would set the run up as plain DDP, without a word
            raise ConfigError("--fsdp true needs GPUs under the Trainer: on CPU accelerate trains plain DDP and "
                              "shards nothing. Drop --fsdp, or use this template's native loop, whose --fsdp "
                              "shards on CPU too")
        if self.fsdp_config is None:
            self.fsdp_config = dict(FSDP2)


def check_parallel_setup(args: TrainingArguments) -> None:
    """--fsdp: accelerate shards the model only in a run torchrun started on GPUs (MULTI_GPU, even of one
    process). Elsewhere it would train plain DDP without a word (on CPU, which parsing refuses already), or
    the Trainer would stop with a traceback (one process started without torchrun)."""
    from accelerate.utils import DistributedType

    if not args.fsdp:
        return
    kind = args.distributed_state.distributed_type
    if kind != DistributedType.MULTI_GPU:
        raise ConfigError(f"--fsdp true: accelerate set this run up as {kind.value}, which it does not shard; start "
                          "it with torchrun on GPUs (scripts/train_single_node.sh), or drop --fsdp")


def parallelize(model: torch.nn.Module, args: TrainingArguments) -> TrainerCallback:
    """--fsdp: the blocks named to accelerate. The callback proves the ranks in step: sharded, or DDP's."""
    if not args.fsdp:
        return GradientSyncCheck()
    shard_blocks_of(model, args)
    return ShardingCheck()


def shard_blocks_of(model: torch.nn.Module, args: TrainingArguments) -> None:
    """--fsdp: name the model's transformer block class (transformer_blocks) to accelerate's FSDP2 auto-wrap,
    so that each block is sharded and gathered on its own, then the root, not the whole model as one unit
    (where _no_split_modules is empty). A class --fsdp_config names wins."""
    name = type(transformer_blocks(model)[0]).__name__
    args.fsdp_plugin_args.setdefault("transformer_cls_names_to_wrap", name)


def transformer_blocks(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The repeated blocks FSDP shards one by one: the ModuleList of one class holding the most weights
    (BERT's encoder.layer, GPT-2's h, Llama's layers). transformers' _no_split_modules names them for some
    families only (DistilBERT, ELECTRA and DeBERTa-v2 leave it empty)."""
    lists = [module for module in model.modules() if isinstance(module, torch.nn.ModuleList)
             and len({type(block) for block in module}) == 1 and any(True for _ in module.parameters())]
    if not lists:
        #% if cookiecutter.include_lora
        model = lora.classifier_of(model)  # its own class's name, not peft's wrapper's
        #% endif
        raise ConfigError(f"--fsdp: found no list of repeated transformer blocks in {type(model).__name__} to "
                          "shard one by one; train it without --fsdp")
    return max(lists, key=lambda blocks: sum(p.numel() for p in blocks.parameters()))


class ShardingCheck(TrainerCallback):
    """--fsdp: once accelerate has wrapped the model, check that it is sharded, and say into which units."""

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        units = {module: name for name, module in model.named_modules() if isinstance(module, FSDPModule)}
        if not units:
            raise RuntimeError("--fsdp true, but accelerate left the model unsharded: it would train as plain DDP")
        blocks = [block for block in transformer_blocks(model) if block in units]
        # Besides the blocks and the root, accelerate shards the input embeddings on their own.
        others = ["the root" if name == "" else name for module, name in units.items() if module not in blocks]
        logger.info("FSDP: %d %s blocks, %s sharded over %d ranks, each on its own", len(blocks),
                    type(blocks[0]).__name__.removeprefix("FSDP") if blocks else "transformer", " and ".join(others),
                    args.world_size)


class GradientSyncCheck(TrainerCallback):
    """Before the first optimizer step, prove every rank holds the same averaged gradients."""

    def __init__(self) -> None:
        self.checked = False

    def on_pre_optimizer_step(self, args, state, control, model=None, **kwargs):
        if not self.checked:
            assert_gradients_synchronised(model)
            self.checked = True


@contextlib.contextmanager
def whole_weights(model: torch.nn.Module) -> Iterator[None]:
    """Inside, every rank holds FSDP's whole weights and a forward communicates nothing, so ranks may run
    different numbers of predict batches. Outside, the weights are sharded again."""
    modules = [module for module in model.modules() if isinstance(module, FSDPModule)]
    for module in modules:
        module.set_reshard_after_forward(False, recurse=False)
        module.unshard()
    try:
        yield
    finally:
        for module in modules:
            module.reshard()
            # fully_shard's defaults: blocks reshard after forward, the root keeps its weights until backward.
            module.set_reshard_after_forward(module is not model, recurse=False)
