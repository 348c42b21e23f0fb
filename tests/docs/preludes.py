"""The tiny objects documented blocks assume (``<!-- doc-test: prelude=NAME -->``).

Each prelude is Python source run before the block, in the block's namespace and in its
working directory (a fresh tmp dir). Names follow the docs: ``model``, ``opt``, ``sched``,
``scaler``, ``dataset``/``ds``, ``loader``, ``sampler``, ``loss_fn``, ``loss``, ``tok_hash``,
``step``, ``total``/``total_steps``...; they are small so a block runs in a second.
"""

from __future__ import annotations

TINY_TRAINING = '''\
import torch, ckptkit
torch.manual_seed(0)
_g = torch.Generator().manual_seed(1)
dataset = ds = torch.utils.data.TensorDataset(torch.randn(24, 8, generator=_g),
                                              torch.randn(24, 1, generator=_g))
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1 / (1 + 0.05 * s))
scaler = torch.amp.GradScaler("cpu", enabled=False)
loss_fn = torch.nn.functional.mse_loss
x, y = dataset[:8]
loss = loss_fn(model(x), y)
loss.backward()
opt.step()
sched.step()
opt.zero_grad()
tok_hash = "tok-5f0c2e"
step = 100
total = total_steps = 4
'''

TINY_LOOP = TINY_TRAINING + '''\
from torch.nn.utils import clip_grad_norm_
sampler = ckptkit.ResumableSampler(dataset, seed=0)
loader = torch.utils.data.DataLoader(dataset, batch_size=4, sampler=sampler)
rec = ckptkit.Recorder(None)
ts = train_state = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched,
                                      sampler=sampler, recorder=rec)
gn = torch.tensor(0.5)
max_logit = 3.0
def train_one_step():
    x, y = dataset[:4]
    loss = loss_fn(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    return loss
'''

SAVED_RUN = TINY_TRAINING + '''\
_ts = ckptkit.TrainState(model=model, optimizer=opt, scheduler=sched)
with ckptkit.CheckpointManager("runs/exp1/ckpt", keep_last=3) as _mgr:
    for _ts.step in (1000, 2000):
        _mgr.save(_ts)
'''

HMAC = TINY_TRAINING + '''\
import os
os.makedirs("secrets", exist_ok=True)
with open("secrets/ckptkit-hmac", "wb") as _f:
    _f.write(b"k" * 32)
state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": 1000}
'''

SIGNED = HMAC + '''\
from ckptkit.verify.describe import describe as _describe
key = b"k" * 32
ckptkit.save({**state, "step": 2000}, "ckpt/step-00002000", key=key)
pinned_digest = _describe("ckpt/step-00002000", key=key)["manifest_digest"]
'''

HF_TRAINER = '''\
import warnings
warnings.filterwarnings("ignore")                 # third-party CPU and deprecation notes
import torch, transformers
from transformers import Trainer, TrainingArguments
transformers.logging.set_verbosity_error()
torch.manual_seed(0)
class _Tokens(torch.utils.data.Dataset):
    def __len__(self): return 16
    def __getitem__(self, i):
        x = torch.randint(0, 64, (8,), generator=torch.Generator().manual_seed(i))
        return {"input_ids": x, "labels": x}
ds = _Tokens()
model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
    n_layer=1, n_embd=16, n_head=2, vocab_size=64, n_positions=32))
args = TrainingArguments(output_dir="out", max_steps=4, save_steps=2, per_device_train_batch_size=4,
                         report_to=[], use_cpu=True, disable_tqdm=True, seed=0)
'''

ACCELERATE = '''\
import warnings
warnings.filterwarnings("ignore")
import torch
from torch.utils.data import DataLoader
from accelerate import Accelerator
from accelerate.utils import DataLoaderConfiguration, ProjectConfiguration
torch.manual_seed(0)
seed = 0
ds = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 2))
model = torch.nn.Linear(4, 2)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, 1)
loss = torch.tensor(0.5)
total = 5
'''

LIGHTNING = '''\
import warnings
warnings.filterwarnings("ignore")
import torch
import lightning as L
from torch.utils.data import DataLoader
from lightning.pytorch.callbacks import ModelCheckpoint
torch.manual_seed(0)
dataset = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 2))
class _LM(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 2)
    def training_step(self, batch, _i):
        x, y = batch
        return ((self.lin(x) - y) ** 2).mean()
    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)
model = _LM()
total_steps = 4
'''

FABRIC = '''\
import warnings
warnings.filterwarnings("ignore")
import torch
import lightning as L
torch.manual_seed(0)
fabric = L.Fabric(accelerator="cpu", devices=1)
dataset = torch.utils.data.TensorDataset(torch.randn(24, 4), torch.randn(24, 2))
model = torch.nn.Linear(4, 2)
opt = torch.optim.Adam(model.parameters(), lr=1e-2)
sched = torch.optim.lr_scheduler.StepLR(opt, 1)
model, opt = fabric.setup(model, opt)
loss_fn = torch.nn.functional.mse_loss
total_steps = 5
'''

MANAGER = '''\
mgr = ckptkit.CheckpointManager("runs/exp1/ckpt", keep_last=3)
'''

PRELUDES = {
    "manager": MANAGER,
    "tiny_training": TINY_TRAINING,
    "tiny_loop": TINY_LOOP,
    "saved_run": SAVED_RUN,
    "hmac": HMAC,
    "signed": SIGNED,
    "hf_trainer": HF_TRAINER,
    "accelerate": ACCELERATE,
    "lightning": LIGHTNING,
    "fabric": FABRIC,
}
