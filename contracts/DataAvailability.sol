// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;
// Block time is the protocol's clock by design (demand deadlines, challenge windows): see docs/lint.md.
// solhint-disable not-rely-on-time

// The interface file is the availability vocabulary (ids, enums, structs, errors).
// solhint-disable-next-line no-global-import
import "contracts/interfaces/IDataAvailability.sol";
import {IJobRegistry} from "contracts/interfaces/IJobRegistry.sol";
import {LibClock} from "contracts/lib/Clock.sol";
import {
    InvalidDeployment, JobId, JobParams, JobStatus, Unauthorized, WrongJobStatus, WrongLength
} from "contracts/lib/GameTypes.sol";
import {Merkle} from "contracts/lib/Merkle.sol";
import {TensorProof} from "contracts/lib/TensorProof.sol";

/// @title DataAvailability
/// @notice Demands for committed data that exists on-chain only as a root, answered by the trainer
///         in calldata within its clock, and proofs that a committed op log is malformed (see
///         IDataAvailability). Settles through the registry, which holds every wei.
/// @dev Bounds (docs/protocol.md "Data availability"): an answer carries at most MAX_SLOTS (1024)
///      state components, MAX_OP_ROOTS op log roots or MAX_LOG_LEAVES log leaves, so every answer
///      fits in one transaction whatever the model size; larger data is paged by further demands.
contract DataAvailability is IDataAvailability {
    /// @notice Most op log roots in one Step answer (32 bytes each: 32 KiB of calldata).
    uint256 public constant MAX_OP_ROOTS = 1024;
    /// @notice Most log leaves in one Log answer or malformation proof (9 bytes each: 36 KiB).
    uint256 public constant MAX_LOG_LEAVES = 4096;
    /// @notice `startPosition` of a Log demand that accepts a run starting anywhere.
    uint64 public constant NO_POSITION = type(uint64).max;
    /// @notice Largest element index end of a Log demand (toIndex + 1 must be below the HIGH key).
    uint256 public constant MAX_TO_INDEX = 0xFFFFFFFE;
    /// @notice Gas of an answer besides its data (calldata words, proofs, event, settlement), in the fee model.
    uint256 public constant ANSWER_BASE_GAS = 350_000;
    /// @notice Gas per 32-byte root of a Step answer (state components and op log roots), in the fee model.
    uint256 public constant GAS_PER_ROOT = 3_000;
    /// @notice Gas per 9-byte leaf of a Log answer, in the fee model.
    uint256 public constant GAS_PER_LEAF = 2_600;

    uint256 private constant LEAF = 9;
    uint256 private constant HIGH_KEY = 0xFFFFFFFF;
    uint8 private constant CODE_DOWN = 1;
    uint8 private constant CODE_EXPLICIT = 3;

    /// @inheritdoc IDataAvailability
    IJobRegistry public immutable registry;

    /// @inheritdoc IDataAvailability
    uint256 public immutable feeGasPrice;

    /// @inheritdoc IDataAvailability
    uint64 public demandCount;

    mapping(DemandId id => Demand record) internal _demands;
    mapping(bytes32 opKey => uint64 size) internal _logSize;

    /// @notice Binds the registry; its deployer must then call `setAvailability(this)`.
    /// @param registry_ The JobRegistry.
    /// @param feeGasPrice_ Wei per gas of the answer fee a demander pays the trainer (>= 1).
    constructor(IJobRegistry registry_, uint256 feeGasPrice_) {
        // SAFETY: a zero price makes demands free again: a griefer could make the trainer spend gas.
        if (feeGasPrice_ == 0) revert InvalidDeployment("feeGasPrice", 0);
        // SAFETY: the largest fee (a full log page) fits the Demand record's uint128.
        if (feeGasPrice_ > type(uint128).max / (ANSWER_BASE_GAS + GAS_PER_LEAF * MAX_LOG_LEAVES)) {
            revert InvalidDeployment("feeGasPrice", feeGasPrice_);
        }
        registry = registry_;
        feeGasPrice = feeGasPrice_;
    }

    // ------------------------------------------------------------ demands

    /// @inheritdoc IDataAvailability
    function demandStep(JobId job, uint64 interval, uint64 step, uint32 firstOp)
        external
        payable
        returns (DemandId id)
    {
        JobParams memory p = registry.jobParams(job);
        // INVARIANT: a page starts at an op of the graph (its length is then fixed by nOps).
        if (firstOp >= p.nOps) revert OpOutOfRange(firstOp, p.nOps);
        id = _open(job, interval, step, DemandKind.Step, _stepFee(p, firstOp));
        _demands[id].op = firstOp;
        _emitCreated(id, _demands[id]);
    }

    /// @inheritdoc IDataAvailability
    function demandLog(
        JobId job,
        uint64 interval,
        uint64 step,
        uint32 op,
        uint32 fromIndex,
        uint32 toIndex,
        uint64 startPosition
    ) external payable returns (DemandId id) {
        JobParams memory p = registry.jobParams(job);
        if (op >= p.nOps) revert OpOutOfRange(op, p.nOps);
        // INVARIANT: a non-empty range whose end key toIndex + 1 is below HIGH, so a sorted log
        // always holds a leaf that reaches it (HIGH at the latest).
        if (fromIndex >= toIndex || toIndex > MAX_TO_INDEX) revert BadIndexRange(fromIndex, toIndex, MAX_TO_INDEX);
        if (startPosition != NO_POSITION && startPosition != 0) {
            // INVARIANT: every demand has an honest answer. A fixed start other than the first leaf
            // names a leaf of a log whose size an answer bound (claimed positions then name real
            // leaves): a position past the log could never be answered, and the trainer would be
            // convicted on time for data it holds.
            uint64 size = _logSize[keccak256(abi.encode(job, step, op))];
            if (startPosition >= size) revert StartNotPublished(startPosition, size);
        }
        id = _open(job, interval, step, DemandKind.Log, _logFee(fromIndex, toIndex, startPosition));
        Demand storage d = _demands[id];
        d.op = op;
        d.fromIndex = fromIndex;
        d.toIndex = toIndex;
        d.startPosition = startPosition;
        _emitCreated(id, d);
    }

    // ------------------------------------------------------------ answers

    /// @inheritdoc IDataAvailability
    function answerStep(
        DemandId id,
        bytes32[] calldata components,
        bytes32 logRoot,
        bytes32[] calldata stepProof,
        bytes32[] calldata opLogRoots,
        bytes32[] calldata opSiblings
    ) external {
        Demand storage d = _answering(id, DemandKind.Step);
        JobParams memory p = registry.jobParams(d.job);
        // INVARIANT: a state root has exactly nSlots components (nSlots <= 1024 bounds rootOf).
        if (components.length != p.nSlots) revert WrongLength(components.length, p.nSlots);
        bytes32 stateRoot = Merkle.rootOf(components);
        _verifyStep(d.job, d.interval, d.step, stateRoot, logRoot, stepProof);
        uint256 first = d.op;
        uint256 count = p.nOps - first < MAX_OP_ROOTS ? p.nOps - first : MAX_OP_ROOTS;
        // INVARIANT: the page is exactly [firstOp, firstOp + count) of the nOps-leaf tree logRoot_s
        // (size known on-chain, so positions are bound).
        if (opLogRoots.length != count) revert WrongLength(opLogRoots.length, count);
        TensorProof.verifyRange(logRoot, first, p.nOps, abi.encodePacked(opLogRoots), 32, opSiblings);
        emit StepPublished(id, d.job, d.step, stateRoot, logRoot, components, d.op, opLogRoots);
        // The page's size was known at the demand: the fee was priced on it, all of it is earned.
        _answered(id, d, p, d.fee);
    }

    /// @inheritdoc IDataAvailability
    function answerLog(DemandId id, LogRun calldata run) external {
        Demand storage d = _answering(id, DemandKind.Log);
        JobParams memory p = registry.jobParams(d.job);
        bytes memory leaves = run.leaves;
        uint256 count = _verifyRun(d.job, d.interval, d.step, d.op, run, leaves, p.nOps);
        (Malformation why, uint256 at) = _malformation(leaves, count, run.position, run.size);
        if (why != Malformation.None) {
            // INVARIANT: a proven run of the committed log is out of order or invalid: fraud,
            // whatever the demand asked; the demander takes its bond and the stake.
            d.status = DemandStatus.Convicted;
            emit LogMalformed(d.job, d.step, d.op, d.demander, why, at);
            registry.refundFee(d.job, d.demander, d.fee);
            registry.settleGame(d.job, d.demander, false);
            return;
        }
        uint256 firstKey = _key(leaves, 0);
        uint256 lastKey = _key(leaves, count - 1);
        bool fixedStart = d.startPosition != NO_POSITION;
        // INVARIANT: the run starts at or below the range (first key <= fromIndex < fromIndex + 1),
        // or at the start the demander fixed (the first leaf, or a leaf of a bound size: that leaf,
        // whatever its key; one past the range is the demander's choice, never the trainer's), and
        // covers it to the end key, or is a full page the demander continues from lastKey.
        if (
            (!fixedStart && firstKey > d.fromIndex)
                || (lastKey < uint256(d.toIndex) + 1 && count != MAX_LOG_LEAVES)
        ) {
            revert RunDoesNotAnswer(firstKey, lastKey, count);
        }
        if (fixedStart && run.position != d.startPosition) {
            revert WrongPosition(run.position, d.startPosition);
        }
        bytes32 opKey = keccak256(abi.encode(d.job, d.step, d.op));
        uint64 bound = _logSize[opKey];
        // INVARIANT: one claimed size per op log: claimed positions then map to the real tree's
        // leaves preserving order and adjacency, so runs chained by position are one real run.
        if (bound == 0) _logSize[opKey] = run.size;
        else if (run.size != bound) revert WrongLogSize(run.size, bound);
        emit LogPublished(id, d.job, d.step, d.op, run.opLogRoot, run.position, run.size, leaves);
        // The trainer earns the fee of the leaves it published (at most the demand's bound); the
        // demander gets back what a shorter log did not need.
        uint256 earned = feeGasPrice * (ANSWER_BASE_GAS + GAS_PER_LEAF * count);
        _answered(id, d, p, earned < d.fee ? earned : d.fee);
    }

    /// @inheritdoc IDataAvailability
    function claimTimeout(DemandId id) external {
        Demand storage d = _demand(id);
        if (d.status != DemandStatus.Open) revert DemandNotOpen(id, d.status);
        _expectActive(d.job);
        // INVARIANT: the trainer may still answer at its deadline second.
        if (!d.clock.expired(block.timestamp)) revert DeadlineNotPassed(d.clock.deadline(), block.timestamp);
        d.status = DemandStatus.TimedOut;
        emit DemandTimedOut(id, d.job);
        // INVARIANT: an unanswered demand's fee goes back with the trainer's conviction.
        registry.refundFee(d.job, d.demander, d.fee);
        registry.settleGame(d.job, d.demander, false);
    }

    /// @inheritdoc IDataAvailability
    function closeDemand(DemandId id) external {
        Demand storage d = _demand(id);
        if (d.status != DemandStatus.Open) revert DemandNotOpen(id, d.status);
        JobStatus js = registry.jobStatus(d.job);
        // INVARIANT: only a job proven fraudulent elsewhere releases a bond without an answer.
        if (js != JobStatus.Fraudulent) revert WrongJobStatus(d.job, js, JobStatus.Fraudulent);
        d.status = DemandStatus.Closed;
        emit DemandClosed(id, d.job);
        registry.refundGame(d.job, d.demander);
        registry.refundFee(d.job, d.demander, d.fee);
    }

    /// @inheritdoc IDataAvailability
    function proveMalformedLog(JobId job, uint64 interval, uint64 step, uint32 op, LogRun calldata run) external {
        JobParams memory p = registry.jobParams(job);
        _expectActive(job);
        if (op >= p.nOps) revert OpOutOfRange(op, p.nOps);
        bytes memory leaves = run.leaves;
        uint256 count = _verifyRun(job, interval, step, op, run, leaves, p.nOps);
        (Malformation why, uint256 at) = _malformation(leaves, count, run.position, run.size);
        if (why == Malformation.None) revert LogWellFormed();
        emit LogMalformed(job, step, op, msg.sender, why, at);
        registry.convict(job, msg.sender);
    }

    // ------------------------------------------------------------ views

    /// @inheritdoc IDataAvailability
    function getDemand(DemandId id) external view returns (Demand memory) {
        return _demand(id);
    }

    /// @inheritdoc IDataAvailability
    function stepDemandFee(JobId job, uint32 firstOp) external view returns (uint256) {
        JobParams memory p = registry.jobParams(job);
        if (firstOp >= p.nOps) revert OpOutOfRange(firstOp, p.nOps);
        return _stepFee(p, firstOp);
    }

    /// @inheritdoc IDataAvailability
    function logDemandFee(uint32 fromIndex, uint32 toIndex, uint64 startPosition) external view returns (uint256) {
        if (fromIndex >= toIndex || toIndex > MAX_TO_INDEX) revert BadIndexRange(fromIndex, toIndex, MAX_TO_INDEX);
        return _logFee(fromIndex, toIndex, startPosition);
    }

    /// @inheritdoc IDataAvailability
    function logSize(JobId job, uint64 step, uint32 op) external view returns (uint64) {
        return _logSize[keccak256(abi.encode(job, step, op))];
    }

    // ------------------------------------------------------------ internals

    function _demand(DemandId id) internal view returns (Demand storage d) {
        d = _demands[id];
        if (d.status == DemandStatus.None) revert UnknownDemand(id);
    }

    function _expectActive(JobId job) internal view {
        JobStatus js = registry.jobStatus(job);
        if (js != JobStatus.Active) revert WrongJobStatus(job, js, JobStatus.Active);
    }

    /// @dev Fee of a Step demand: the answer's nSlots components and its page of op log roots.
    function _stepFee(JobParams memory p, uint32 firstOp) internal view returns (uint256) {
        uint256 page = p.nOps - firstOp < MAX_OP_ROOTS ? p.nOps - firstOp : MAX_OP_ROOTS;
        return feeGasPrice * (ANSWER_BASE_GAS + GAS_PER_ROOT * (uint256(p.nSlots) + page));
    }

    /// @dev Fee of a Log demand: the most leaves an answer can need, toIndex - fromIndex entries and
    ///      the two bracketing leaves, at most a page; a full page with a fixed start (the leaves
    ///      between that start and the range are not known here, and the answer must publish them).
    function _logFee(uint32 fromIndex, uint32 toIndex, uint64 startPosition) internal view returns (uint256) {
        uint256 leaves = uint256(toIndex) - fromIndex + 2;
        // SAFETY: a fixed start far below the range forces up to a page of leaves: priced so, or a
        // griefer makes the trainer publish 4,096 leaves for the fee of 3.
        if (leaves > MAX_LOG_LEAVES || startPosition != NO_POSITION) leaves = MAX_LOG_LEAVES;
        return feeGasPrice * (ANSWER_BASE_GAS + GAS_PER_LEAF * leaves);
    }

    /// @dev Locks the bond and the fee in the registry (status, posted interval, value) and records the demand.
    function _open(JobId job, uint64 interval, uint64 step, DemandKind kind, uint256 fee)
        internal
        returns (DemandId id)
    {
        // Unextended window end: the interval's chained window start + challengeWindow
        // (0 when not posted: lockDemand reverts with IntervalNotPosted).
        uint256 end = registry.unextendedWindowEnd(job, interval);
        // SAFETY: demands only inside the unextended window, so answers extend it by at most
        // 2 * clock in all (registry.extendWindow's cap, from the same base): a demander cannot
        // delay finalize further.
        if (end != 0 && block.timestamp > end) {
            revert DemandWindowClosed(job, interval, end, block.timestamp);
        }
        // SAFETY: the registry checks Active, posted, its window and the exact bond + fee, and keeps them.
        (address trainer,, uint64 firstStep, uint64 size, uint64 clock) =
            registry.lockDemand{value: msg.value}(job, interval, msg.sender, fee);
        if (step < firstStep || step >= firstStep + size) revert StepNotInInterval(step, firstStep, size);
        id = DemandId.wrap(++demandCount);
        Demand storage d = _demands[id];
        d.job = job;
        d.interval = interval;
        d.step = step;
        d.kind = kind;
        d.status = DemandStatus.Open;
        d.demander = msg.sender;
        d.trainer = trainer;
        // The trainer's clock runs from now: `clock` seconds, its last second included.
        d.clock = LibClock.wrap(clock, uint64(block.timestamp));
        d.startPosition = NO_POSITION;
        // SAFETY: fee <= feeGasPrice * (ANSWER_BASE_GAS + GAS_PER_LEAF * MAX_LOG_LEAVES) < 2^128
        // (checked at deployment), so the cast is exact.
        d.fee = uint128(fee);
    }

    function _emitCreated(DemandId id, Demand storage d) internal {
        emit DemandCreated(
            id,
            d.job,
            d.demander,
            d.interval,
            d.step,
            d.kind,
            d.op,
            d.fromIndex,
            d.toIndex,
            d.startPosition,
            d.clock.deadline()
        );
    }

    /// @dev The open demand `id` of `kind`, answered by its trainer by the deadline, on an Active job;
    ///      stops the trainer's clock (reverts with `ClockExpired` after the deadline: claimTimeout).
    function _answering(DemandId id, DemandKind kind) internal returns (Demand storage d) {
        d = _demand(id);
        if (d.status != DemandStatus.Open) revert DemandNotOpen(id, d.status);
        if (d.kind != kind) revert WrongKind(id, d.kind);
        // INVARIANT: only the trainer answers for its commitments.
        if (msg.sender != d.trainer) revert Unauthorized(msg.sender, d.trainer);
        _expectActive(d.job);
        // INVARIANT: the deadline second is the last valid one, as for the game's clocks.
        d.clock = d.clock.stop(block.timestamp);
    }

    /// @dev Bond (and the unearned fee) back to the demander, `earned` to the trainer, and the
    ///      interval's window moved to at least now + clock.
    function _answered(DemandId id, Demand storage d, JobParams memory p, uint256 earned) internal {
        d.status = DemandStatus.Answered;
        uint256 until = block.timestamp + p.clock;
        emit DemandAnswered(id, d.job, until);
        registry.releaseDemand(d.job, d.demander, d.fee, earned);
        registry.extendWindow(d.job, d.interval, until);
    }

    /// @dev Reverts unless step leaf (step, stateRoot, logRoot) is in posted interval `interval`.
    function _verifyStep(
        JobId job,
        uint64 interval,
        uint64 step,
        bytes32 stateRoot,
        bytes32 logRoot,
        bytes32[] calldata stepProof
    ) internal view {
        (uint64 firstStep, uint64 size) = registry.intervalSpan(job, interval);
        if (step < firstStep || step >= firstStep + size) revert StepNotInInterval(step, firstStep, size);
        bytes32 root = registry.getInterval(job, interval).root;
        // INVARIANT: the step's position in the interval (size known on-chain) fixes s.
        Merkle.verify(root, Merkle.leafHash(abi.encodePacked(step, stateRoot, logRoot)), step - firstStep, size, stepProof);
    }

    /// @dev Verifies a log run down to the interval root; returns its number of leaves.
    function _verifyRun(
        JobId job,
        uint64 interval,
        uint64 step,
        uint32 op,
        LogRun calldata run,
        bytes memory leaves,
        uint32 nOps
    ) internal view returns (uint256 count) {
        // INVARIANT: whole 9-byte leaves, at least one, at most a page (one transaction's worth).
        if (leaves.length == 0 || leaves.length % LEAF != 0 || leaves.length > MAX_LOG_LEAVES * LEAF) {
            revert BadRunLength(leaves.length, MAX_LOG_LEAVES);
        }
        count = leaves.length / LEAF;
        _verifyStep(job, interval, step, run.stateRoot, run.logRoot, run.stepProof);
        Merkle.verify(run.logRoot, Merkle.leafHash(abi.encodePacked(run.opLogRoot)), op, nOps, run.opProof);
        // INVARIANT: a verifying range opening is a run of consecutive leaves of the real tree
        // whatever size is claimed; claimed position 0 / size - 1 are its first / last leaf.
        TensorProof.verifyRange(run.opLogRoot, run.position, run.size, leaves, LEAF, run.siblings);
    }

    /// @dev The first malformation within a verified run (None if it is well-formed).
    function _malformation(bytes memory leaves, uint256 count, uint256 position, uint256 size)
        internal
        pure
        returns (Malformation, uint256)
    {
        if (position == 0 && _word(leaves, 0) != 0) return (Malformation.FirstNotLow, 0);
        if (position + count == size && _word(leaves, count - 1) != HIGH_KEY << 40) {
            return (Malformation.LastNotHigh, size - 1);
        }
        uint256 prev;
        for (uint256 i = 0; i < count; ++i) {
            uint256 w = _word(leaves, i);
            uint256 key = w >> 40;
            uint256 code = (w >> 32) & 0xFF;
            uint256 value = w & 0xFFFFFFFF;
            // INVARIANT: keys strictly increase: one entry per element, sentinels at the ends.
            if (i > 0 && key <= prev) return (Malformation.KeyOrder, position + i - 1);
            if (key == 0 || key == HIGH_KEY) {
                // Sentinels carry neither code nor value.
                if (code != 0 || value != 0) return (Malformation.BadCode, position + i);
            } else if (code < CODE_DOWN || code > CODE_EXPLICIT || (code != CODE_EXPLICIT && value != 0)) {
                // An entry is down, up or explicit; only explicit carries a value (as logfile encodes).
                return (Malformation.BadCode, position + i);
            }
            prev = key;
        }
        return (Malformation.None, 0);
    }

    /// @dev Key of leaf `i` of a run.
    function _key(bytes memory leaves, uint256 i) internal pure returns (uint256) {
        return _word(leaves, i) >> 40;
    }

    /// @dev Leaf `i` of a run as a 72-bit big-endian integer (i < count, checked by the caller).
    function _word(bytes memory leaves, uint256 i) internal pure returns (uint256 w) {
        // One word load per leaf instead of nine bounds-checked byte reads; read-only, in bounds.
        // solhint-disable-next-line no-inline-assembly
        assembly ("memory-safe") {
            w := shr(184, mload(add(add(leaves, 32), mul(i, 9))))
        }
    }
}
