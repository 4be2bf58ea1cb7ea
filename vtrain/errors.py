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
    """Raised when an op produces NaN or an infinity (never a valid FP32 training value).

    ``op`` and ``index`` (the op id and the flat output element), when the raiser knows them, say
    where: an auditor disputes exactly that element (its correct value has no finite FP32 value,
    so no finite claim of it stands). :func:`nonfinite_origin` finds them through re-raises."""

    def __init__(self, message: str, *, op: int | None = None, index: int | None = None) -> None:
        super().__init__(message)
        self.op = op
        self.index = index


def nonfinite_origin(e: BaseException) -> NonFiniteValue | None:
    """The first :class:`NonFiniteValue` in ``e``'s context chain (``e`` itself included) that
    names its element (``index`` set): re-raises that add the step or op to the message keep the
    original as their ``__context__``. None when none does."""
    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, NonFiniteValue) and cur.index is not None:
            return cur
        cur = cur.__cause__ or cur.__context__
    return None


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


# -- served artifacts: one narrow type per problem (messages "expected X, got Y") -------------------


class LogFramingError(CorruptLog):
    """The bytes do not frame a rounding log at all (header, compression, lengths, op table): they
    define no log entries, so nothing in them can be matched against a commitment."""


class LogHeaderError(LogFramingError):
    """Wrong magic, version, mode, step or graph op count in a log's header."""


class LogCompressionError(LogFramingError):
    """A log's compressed payload does not decompress."""


class LogTruncated(LogFramingError):
    """A log (header or payload) ends before the lengths it declares."""


class LogTrailingBytes(LogFramingError):
    """A log's payload goes on after its last declared entry."""


class LogOpTableError(LogFramingError):
    """A log's op table is wrong: more ops than the graph, an op id out of range or repeated."""


class LogEntryError(CorruptLog):
    """A well-framed log whose entries break the format's rules. ``op`` names the op (its leaves are
    still defined, so such a log can be committed: see ``protocol.auditor.MalformedCommittedLog``)."""

    def __init__(self, message: str, op: int) -> None:
        super().__init__(message)
        self.op = op


class LogIndexOrderError(LogEntryError):
    """An op's entry indices are not strictly increasing (unsorted or duplicated)."""


class LogIndexRangeError(LogEntryError):
    """An entry index is not below the op's element count."""


class LogCodeError(LogEntryError):
    """An entry code is not one of DOWN (1), UP (2), EXPLICIT (3)."""


class LogValueError(LogEntryError):
    """An explicit entry's value is NaN or an infinity (never a valid FP32 training value)."""


class CorruptStepRecord(CorruptArtifact):
    """A step record is not valid JSON of the record's fields, or is not self-consistent."""


class CorruptCheckpoint(CorruptArtifact):
    """A checkpoint is not a valid vtrain checkpoint (safetensors, content digest, slots)."""


class NotCommitted(CorruptArtifact):
    """An artifact that decodes but is not what the trainer committed on-chain (substituted, stale
    or forged): its hash or root differs from the posted commitment."""
