"""Run by test_cuda.py in a fresh process (deterministic kernels are a process-wide switch, and cuBLAS reads its
workspace setting before its first use): train straight, and again interrupted and resumed, on CUDA; print the
names of the parameters that differ, one per line, then "done"."""

import sys

import torch

from nmt.config import load_config
from nmt.train.trainer import Trainer

config_path, folder, precision = sys.argv[1:4]
settings = ["training.device=cuda", "training.deterministic=true", f"training.precision={precision}",
            "training.validate_every=3", "training.val_max_sentences=10", "training.log_every=2"]


def trainer(run: str, updates: int, resume: bool = False) -> Trainer:
    overrides = [*settings, f"training.run_dir={folder}/{run}", f"training.max_updates={updates}"]
    return Trainer(load_config(config_path, overrides), resume=resume)


straight = trainer("a", 8)
straight.train()
trainer("b", 4).train()
resumed = trainer("b", 8, resume=True)
assert resumed.progress.step == 4, resumed.progress.step
resumed.train()
a, b = straight.model.state_dict(), resumed.model.state_dict()
for key in a:
    if not torch.equal(a[key], b[key]):
        print(key)
print("done")
