"""Data-parallel training on torch.distributed, bit-identical to one process (docs/numerics.md)."""
