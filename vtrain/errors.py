"""The package's exceptions: one root, narrow subclasses."""


class VtrainError(Exception):
    """Root of every error vtrain raises on purpose."""


class InvalidProof(VtrainError):
    """Raised when a Merkle proof does not lead to the expected root."""


class CorruptArtifact(VtrainError):
    """Raised when a stored artifact (log, checkpoint, blob) fails its hash or cannot be decoded."""


class MissingArtifact(VtrainError):
    """Raised when an artifact that should exist is not in the store."""


class NonFiniteValue(VtrainError):
    """Raised when an op produces NaN or an infinity (never a valid FP32 training value)."""


class CorruptLog(CorruptArtifact):
    """Raised when a rounding log is truncated or garbled; the message names the step and op."""


class GraphError(VtrainError):
    """Raised when a graph is built with inconsistent shapes or attributes."""


class SpecError(VtrainError):
    """Raised when a training spec (file, dict or options) is malformed: the message names the key."""


class DatasetError(VtrainError):
    """Raised when a dataset is missing, empty, unreadable or the wrong shape for the model."""


class DataChanged(CorruptArtifact):
    """Raised when a run's pinned data (its copy of the dataset) no longer has the recorded sha256."""


class MissingDataset(DatasetError, MissingArtifact):
    """Raised when a dataset file is not there (unavailable rather than malformed)."""
