"""Domain value types shared by vtrain and protocol (py-evm style ``NewType`` aliases)."""

from __future__ import annotations

from typing import NewType

#: A 32-byte SHA-256 output of any kind: a leaf hash, a node hash or a blob digest.
Digest = NewType("Digest", bytes)
#: A 32-byte Merkle root (RFC 9162 tree over SHA-256).
Root = NewType("Root", bytes)
#: A training step number; step leaves cover steps ``1..N``.
StepIndex = NewType("StepIndex", int)
#: The position of an op in the step graph (0-based, topological order).
OpIndex = NewType("OpIndex", int)
