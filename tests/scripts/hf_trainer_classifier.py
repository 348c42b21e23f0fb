"""A second, differently written Trainer script: a tiny BERT classifier, gradient accumulation.

Sequence classification (not causal LM), ``gradient_accumulation_steps=2``, a cosine
schedule with weight decay, a dataset of plain dicts built in a list comprehension, the
run configured through a dict of ``TrainingArguments``. The ``# ckptkit`` lines are the same
two as in ``hf_trainer_train.py``. ``--fault data-version`` relabels the data on resume;
``--fault no-rng`` deletes ``rng_state.pth`` before resuming, unverified.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from pathlib import Path

import torch
import xxhash
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments

from ckptkit.integrations.hf import CkptkitCallback, resume_checkpoint  # ckptkit

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
fault = sys.argv[sys.argv.index("--fault") + 1] if "--fault" in sys.argv else "none"
resume = os.environ.get("CKPTKIT_DRILL_RESUME_FROM")
g = torch.Generator().manual_seed(7)
x = torch.randint(0, 50, (40, 12), generator=g)
y = (x.sum(1) % 3 if not (resume and fault == "data-version") else (x.sum(1) + 1) % 3).tolist()
rows = [{"input_ids": x[i], "attention_mask": torch.ones(12, dtype=torch.long), "labels": y[i]}
        for i in range(len(x))]

torch.manual_seed(3)
model = BertForSequenceClassification(BertConfig(
    vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
    intermediate_size=64, max_position_embeddings=16, num_labels=3,
    hidden_dropout_prob=0.2, attention_probs_dropout_prob=0.2))
settings = dict(output_dir="clf", max_steps=30, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, learning_rate=5e-4, weight_decay=0.01,
                lr_scheduler_type="cosine", warmup_steps=3, seed=11, save_strategy="no",
                logging_steps=5, report_to=[], use_cpu=True, disable_tqdm=True)
trainer = Trainer(model=model, args=TrainingArguments(**settings), train_dataset=rows,
                  callbacks=[CkptkitCallback()])  # ckptkit
if resume and fault == "no-rng":
    (Path(resume) / "rng_state.pth").unlink()
    ckpt = resume
else:
    ckpt = resume_checkpoint("clf")  # ckptkit
trainer.train(resume_from_checkpoint=ckpt)
h = xxhash.xxh3_64()
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
print(json.dumps({"param_hash": h.hexdigest()}))
