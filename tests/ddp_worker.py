"""Run by torchrun in test_ddp.py: train on one rank, then save that rank's parameters."""

import os
import sys

import torch

from nmt.config import load_config
from nmt.train.trainer import Trainer

config_path, run_dir, out_dir = sys.argv[1:4]
trainer = Trainer(load_config(config_path, [f"training.run_dir={run_dir}", "training.max_updates=6",
                                            "training.validate_every=3", "training.val_max_sentences=10",
                                            "training.device=cpu"]))
trainer.train()
torch.save(trainer.model.state_dict(), os.path.join(out_dir, f"rank{os.environ['RANK']}.pt"))
