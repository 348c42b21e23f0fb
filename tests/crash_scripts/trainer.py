"""The crash matrix's transformers.Trainer run: a one-layer GPT-2 from a config (dropout on),
synthetic tokens the Trainer shuffles, AdamW with linear decay, CPU, and the two documented
ckptkit lines (``# ckptkit``). The Trainer writes to a local ``output_dir`` only.

``python trainer.py ROOT OUT_JSON [KILL_POINT]`` (see ``_harness.py``).
"""

from __future__ import annotations

import warnings
from typing import Any

import torch
from _harness import BATCH, KEEP, SAMPLES, SAVE_EVERY, STEPS, Harness, wrap_framework_writes
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from ckptkit.integrations.hf import CkptkitCallback, resume_checkpoint  # ckptkit

warnings.filterwarnings("ignore")
h = Harness.from_argv()
wrap_framework_writes()


class Tokens(torch.utils.data.Dataset):  # type: ignore[type-arg]
    def __init__(self) -> None:
        self.x = torch.randint(0, 64, (SAMPLES, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class Matrix(TrainerCallback):  # type: ignore[misc]
    """The harness's calls: the resumed step, each step's batch, the kill before a save."""

    def __init__(self) -> None:
        self.inputs: list[torch.Tensor] = []

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        h.resumed(state.global_step)
        self.inputs = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        h.batch(state.global_step, *self.inputs)
        h.arm(state.global_step)  # the Trainer saves after on_step_end

    def seen(self, module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        if module.training and "input_ids" in kwargs:
            self.inputs.append(kwargs["input_ids"])


torch.manual_seed(0)
cfg = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=1, n_head=2,
                 bos_token_id=0, eos_token_id=0)
model = GPT2LMHeadModel(cfg)
matrix = Matrix()
model.register_forward_pre_hook(matrix.seen, with_kwargs=True)
args = TrainingArguments(
    output_dir=h.root, max_steps=STEPS, save_steps=SAVE_EVERY, per_device_train_batch_size=BATCH,
    learning_rate=1e-3, seed=0, report_to=[], use_cpu=True, disable_tqdm=True,
    logging_steps=100, save_total_limit=KEEP,
)
trainer = Trainer(model=model, args=args, train_dataset=Tokens(),
                  callbacks=[CkptkitCallback(), matrix])  # ckptkit
trainer.train(resume_from_checkpoint=resume_checkpoint(h.root))  # ckptkit
h.finish(trainer.state.global_step, model=model, optimizer=trainer.optimizer,
         lr=trainer.lr_scheduler.get_last_lr())
