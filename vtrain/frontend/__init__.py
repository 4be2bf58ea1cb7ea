"""Bring your own PyTorch model: capture with torch.export, lower each ATen op to vtrain primitives."""

from vtrain.frontend.capture import Captured, Field, Schedule, TorchTask, capture, optimizer_config

__all__ = ["Captured", "Field", "Schedule", "TorchTask", "capture", "optimizer_config"]
