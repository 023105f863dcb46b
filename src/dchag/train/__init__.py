"""Distributed training through torchrun: data, checkpoints, the training loop, launchers."""
