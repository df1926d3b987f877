"""Run by torchrun in test_ddp.py: train on one rank (`--resume` among the overrides: resume the run), then
save that rank's parameters."""

import os
import sys

import torch

from nmt.config import load_config
from nmt.train.trainer import Trainer

config_path, run_dir, out_dir, *overrides = sys.argv[1:]
resume = "--resume" in overrides
trainer = Trainer(load_config(config_path, [f"training.run_dir={run_dir}", "training.max_updates=6",
                                            "training.validate_every=3", "training.val_max_sentences=10",
                                            "training.device=cpu", *(o for o in overrides if o != "--resume")]),
                  resume=resume)
if trainer.config.training.lr_schedule == "plateau":      # no validation improves: the lr decays at the first
    trainer.schedule.best = float("inf")                  # (bleu: higher is better)
trainer.train()
torch.save(trainer.model.state_dict(), os.path.join(out_dir, f"rank{os.environ['RANK']}.pt"))
with open(os.path.join(out_dir, f"rank{os.environ['RANK']}.lr"), "w") as handle:
    handle.write(repr(trainer.optimizer.param_groups[0]["lr"]))
