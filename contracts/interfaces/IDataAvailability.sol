// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IJobRegistry} from "contracts/interfaces/IJobRegistry.sol";
import {Clock} from "contracts/lib/Clock.sol";
import {JobId} from "contracts/lib/GameTypes.sol";

/// @notice Id of a data-availability demand; ids start at 1.
type DemandId is uint64;

/// @notice What a demand asks for.
/// @dev Step: the step record of step s (state components, logRoot_s) and one page of its op log roots.
///      Log:  one run of consecutive leaves of op j's log tree covering an index range.
enum DemandKind {
    None,
    Step,
    Log
}

/// @notice Life cycle of a demand.
/// @dev Open -> Answered (bond back) | TimedOut (trainer convicted) | Convicted (the answer showed a
///      malformed log) | Closed (the job became Fraudulent elsewhere; bond back).
enum DemandStatus {
    None,
    Open,
    Answered,
    TimedOut,
    Convicted,
    Closed
}

/// @notice Why a committed op log is malformed (docs/protocol.md, "Data availability").
/// @dev KeyOrder: two adjacent leaves with key_p >= key_{p+1}. BadCode: an entry whose code is not
///      down/up/explicit, a down/up entry with a value, or a sentinel-keyed leaf with a code or value.
///      FirstNotLow: leaf 0 is not the LOW sentinel. LastNotHigh: the last leaf is not HIGH.
enum Malformation {
    None,
    KeyOrder,
    BadCode,
    FirstNotLow,
    LastNotHigh
}

/// @notice A demand's storage record.
/// @param op Log: the op j; Step: the first op log root of the page.
/// @param fromIndex Log: first element index of the range [fromIndex, toIndex).
/// @param toIndex Log: end of the range (exclusive).
/// @param startPosition Log: the claimed leaf position the run must start at (NO_POSITION: any).
/// @param clock The trainer's clock: `clock` seconds from the demand (stopped once answered).
/// @param fee Wei the demander paid with its bond for the answer's gas (held by the registry).
struct Demand {
    JobId job;
    uint64 interval;
    uint64 step;
    DemandKind kind;
    DemandStatus status;
    address demander;
    uint32 op;
    uint32 fromIndex;
    address trainer;
    uint32 toIndex;
    uint64 startPosition;
    Clock clock;
    uint128 fee;
}

/// @notice A run of consecutive leaves of op j's log tree at step s, with every proof down to the
///         posted interval root.
/// @param stateRoot stateRoot_s (with logRoot, the step leaf s).
/// @param logRoot logRoot_s.
/// @param stepProof Inclusion path of the step leaf at s - firstStep in the interval root.
/// @param opLogRoot Op j's log root.
/// @param opProof Inclusion path of leafHash(opLogRoot) at j in logRoot_s (size nOps).
/// @param position Claimed position of the run's first leaf in the op log tree.
/// @param size Claimed size of the op log tree (bound per (job, step, op) by the first answer).
/// @param leaves The run's leaf data, 9 bytes each (`uint32be key || uint8 code || uint32be value`).
/// @param siblings Range-opening siblings of the run (TensorProof order).
struct LogRun {
    bytes32 stateRoot;
    bytes32 logRoot;
    bytes32[] stepProof;
    bytes32 opLogRoot;
    bytes32[] opProof;
    uint64 position;
    uint64 size;
    bytes leaves;
    bytes32[] siblings;
}

/// @notice Thrown when a demand id does not exist.
error UnknownDemand(DemandId id);
/// @notice Thrown when a demand is not in the status the call needs.
error DemandNotOpen(DemandId id, DemandStatus status);
/// @notice Thrown when a demand is made after its interval's (unextended) challenge window.
error DemandWindowClosed(JobId job, uint64 interval, uint256 windowEnd, uint256 now_);
/// @notice Thrown when a demanded step is not in the demanded interval.
error StepNotInInterval(uint64 step, uint64 firstStep, uint64 size);
/// @notice Thrown when a demanded op is not in the graph, or a page starts past the last op.
error OpOutOfRange(uint256 op, uint256 nOps);
/// @notice Thrown when a demanded index range is empty or past the log's key space.
error BadIndexRange(uint256 fromIndex, uint256 toIndex, uint256 limit);
/// @notice Thrown when an answer is of the wrong kind for the demand.
error WrongKind(DemandId id, DemandKind kind);
/// @notice Thrown when a log run's length is not a positive multiple of 9 bytes up to MAX_LOG_LEAVES leaves.
error BadRunLength(uint256 length, uint256 maxLeaves);
/// @notice Thrown when a log run does not answer the demand (start, coverage or position).
/// @param firstKey Key of the run's first leaf.
/// @param lastKey Key of the run's last leaf.
/// @param count Leaves in the run.
error RunDoesNotAnswer(uint256 firstKey, uint256 lastKey, uint256 count);
/// @notice Thrown when a run starts elsewhere than the demanded position.
error WrongPosition(uint256 position, uint256 expected);
/// @notice Thrown when a Log demand fixes a start position other than 0 that is not a leaf of the
///         op log's size bound by an earlier answer (none yet: size 0).
/// @param position The demanded start position.
/// @param size The bound size of the op log (0: not bound yet).
error StartNotPublished(uint256 position, uint256 size);
/// @notice Thrown when a run's claimed tree size differs from the size bound by an earlier answer.
error WrongLogSize(uint256 size, uint256 bound);
/// @notice Thrown when `claimTimeout` comes before the trainer's deadline has passed.
error DeadlineNotPassed(uint256 deadline, uint256 now_);
/// @notice Thrown when `proveMalformedLog` is given a run that is well-formed.
error LogWellFormed();

/// @title IDataAvailability
/// @notice Data-availability remedy (docs/protocol.md, "Data availability"): during an interval's
///         challenge window anyone may demand, with a bond, data that exists on-chain only as a root:
///         the step record of step s (its nSlots state components, logRoot_s and a page of at most
///         MAX_OP_ROOTS op log roots) or one run of at most MAX_LOG_LEAVES leaves of an op's log
///         covering an index range. The trainer must publish it, in calldata, proven against the
///         posted roots, within `clock` seconds; the data is emitted in an event. Answered: the bond
///         is credited back and the interval's window is extended to at least now + clock. Not
///         answered: anyone `claimTimeout`s and the trainer is convicted (the demander wins). Each
///         demand also pays an answer fee sized on-chain to what it demands, earned by the trainer
///         when it answers and refunded with its conviction when it does not (no free griefing). A
///         published run that is out of key order or carries an invalid code convicts the trainer;
///         so does `proveMalformedLog`, by anyone, at any time while the job is Active. Holds no
///         ETH: bonds are locked in the registry, and demands count as open games there.
interface IDataAvailability {
    /// @notice Emitted when a demand is made.
    /// @param deadline Last second at which the trainer may answer.
    event DemandCreated(
        DemandId indexed id,
        JobId indexed job,
        address indexed demander,
        uint64 interval,
        uint64 step,
        DemandKind kind,
        uint32 op,
        uint32 fromIndex,
        uint32 toIndex,
        uint64 startPosition,
        uint256 deadline
    );
    /// @notice Emitted with the data of an answered Step demand (all proven against the interval root).
    /// @param firstOp Position of opLogRoots[0] in logRoot_s.
    event StepPublished(
        DemandId indexed id,
        JobId indexed job,
        uint64 indexed step,
        bytes32 stateRoot,
        bytes32 logRoot,
        bytes32[] components,
        uint32 firstOp,
        bytes32[] opLogRoots
    );
    /// @notice Emitted with the data of an answered Log demand (proven against op j's log root,
    ///         itself proven in logRoot_s and the interval root).
    event LogPublished(
        DemandId indexed id,
        JobId indexed job,
        uint64 indexed step,
        uint32 op,
        bytes32 opLogRoot,
        uint64 position,
        uint64 size,
        bytes leaves
    );
    /// @notice Emitted when a demand is answered; `windowEnd` is the interval's window end after it.
    event DemandAnswered(DemandId indexed id, JobId indexed job, uint256 windowEnd);
    /// @notice Emitted when a demand's deadline passed unanswered (the trainer is convicted).
    event DemandTimedOut(DemandId indexed id, JobId indexed job);
    /// @notice Emitted when a demand on a job made Fraudulent elsewhere is closed (bond refunded).
    event DemandClosed(DemandId indexed id, JobId indexed job);
    /// @notice Emitted when a committed op log is proven malformed (by an answer or `proveMalformedLog`).
    /// @param winner Credited the trainer's stake (plus its bond for a demand).
    /// @param at Claimed position of the offending leaf (KeyOrder: the first of the pair).
    event LogMalformed(
        JobId indexed job, uint64 indexed step, uint32 op, address winner, Malformation reason, uint256 at
    );

    /// @notice Demands the step record of `step` in posted interval `interval`: the nSlots state
    ///         components, logRoot_s and the op log roots [firstOp, min(firstOp + MAX_OP_ROOTS, nOps)).
    /// @dev `msg.value` must be exactly challengerBond + `stepDemandFee(job, firstOp)` (locked in the
    ///      registry; `WrongValue(sent, expected)` otherwise). The fee pays the trainer's answer:
    ///      credited to it when it answers, refunded to the demander with the conviction when it
    ///      does not (or on a job made Fraudulent elsewhere). Reverts while the job
    ///      is not Active, outside the interval's unextended window (`DemandWindowClosed`), for a step
    ///      outside the interval (`StepNotInInterval`) or firstOp >= nOps (`OpOutOfRange`).
    /// @param job The job.
    /// @param interval A posted interval.
    /// @param step A step of that interval.
    /// @param firstOp First op log root of the page.
    /// @return id The new demand.
    function demandStep(JobId job, uint64 interval, uint64 step, uint32 firstOp)
        external
        payable
        returns (DemandId id);

    /// @notice Demands the log entries of elements [fromIndex, toIndex) of op `op` at `step`: a run
    ///         of consecutive leaves of the op log tree whose first key is <= fromIndex (key = index +
    ///         1) and that reaches a key >= toIndex + 1 or holds MAX_LOG_LEAVES leaves (then demand
    ///         again from the last key). With `startPosition` != NO_POSITION the run must start at
    ///         that claimed position (to continue a published run leaf by leaf), whatever its key:
    ///         0, or a leaf of the size bound by an earlier answer (`StartNotPublished` otherwise),
    ///         so every demand has an answer.
    /// @dev Bond, status and window as `demandStep`; `msg.value` is challengerBond +
    ///      `logDemandFee(fromIndex, toIndex, startPosition)`, priced on the most leaves an answer
    ///      can need (toIndex - fromIndex + 2, at most MAX_LOG_LEAVES; a page with a fixed start); an answer earns the trainer the fee of
    ///      the leaves it publishes and the rest goes back to the demander. `BadIndexRange` unless
    ///      fromIndex < toIndex <= 0xFFFFFFFE; `OpOutOfRange` unless op < nOps.
    /// @param job The job.
    /// @param interval A posted interval.
    /// @param step A step of that interval.
    /// @param op The op j.
    /// @param fromIndex First element index.
    /// @param toIndex End element index (exclusive).
    /// @param startPosition Claimed leaf position the run must start at (0 or below the bound size), or
    ///        NO_POSITION.
    /// @return id The new demand.
    function demandLog(
        JobId job,
        uint64 interval,
        uint64 step,
        uint32 op,
        uint32 fromIndex,
        uint32 toIndex,
        uint64 startPosition
    ) external payable returns (DemandId id);

    /// @notice The trainer answers a Step demand; the data is emitted in `StepPublished` and the
    ///         demand's whole fee is credited to the trainer.
    /// @dev Trainer only, by the deadline. `components` (nSlots roots) and `logRoot` form the step
    ///      leaf proven by `stepProof` in the interval root; `opLogRoots` (exactly the page's length)
    ///      are proven by the range opening `opSiblings` at firstOp in logRoot_s (size nOps).
    /// @param id The demand.
    /// @param components The nSlots state component roots of stateRoot_s.
    /// @param logRoot logRoot_s.
    /// @param stepProof Inclusion path of the step leaf in the interval root.
    /// @param opLogRoots The page of op log roots.
    /// @param opSiblings Range-opening siblings of the page in logRoot_s.
    function answerStep(
        DemandId id,
        bytes32[] calldata components,
        bytes32 logRoot,
        bytes32[] calldata stepProof,
        bytes32[] calldata opLogRoots,
        bytes32[] calldata opSiblings
    ) external;

    /// @notice The trainer answers a Log demand with a run of its op log; the run is emitted in
    ///         `LogPublished`, and the trainer is credited feeGasPrice * (ANSWER_BASE_GAS +
    ///         GAS_PER_LEAF * leaves) of the demand's fee (the rest back to the demander). A run out
    ///         of key order or with an invalid leaf (see `Malformation`) convicts the trainer: the
    ///         demander is credited its bond, the bounty and its whole fee.
    /// @dev Trainer only, by the deadline. Reverts (the trainer may retry) for a bad proof, a run that
    ///      does not answer the demand (`RunDoesNotAnswer`, `WrongPosition`) or a claimed size other
    ///      than the one bound by the first answer for (job, step, op) (`WrongLogSize`).
    /// @param id The demand.
    /// @param run The run and its proofs.
    function answerLog(DemandId id, LogRun calldata run) external;

    /// @notice Anyone, once the trainer's deadline has passed on an open demand: the trainer is
    ///         convicted (the demander is credited its bond, the bounty and its fee; the client its
    ///         payment).
    /// @param id The demand.
    function claimTimeout(DemandId id) external;

    /// @notice Anyone closes an open demand of a job made Fraudulent elsewhere; its bond and fee are refunded.
    /// @param id The demand.
    function closeDemand(DemandId id) external;

    /// @notice Anyone proves, while the job is Active, that op `op`'s committed log at `step` is
    ///         malformed: two adjacent leaves out of key order, a leaf with an invalid code, a first
    ///         leaf that is not LOW or a last leaf that is not HIGH, within `run` (any run of at most
    ///         MAX_LOG_LEAVES leaves; claimed position 0 and size - 1 are the tree's first and last
    ///         leaves whatever size is claimed). The caller is credited the trainer's stake.
    /// @dev Reverts with `LogWellFormed` when the run shows no malformation.
    /// @param job The job.
    /// @param interval The posted interval holding `step`.
    /// @param step The step.
    /// @param op The op j.
    /// @param run The run and its proofs.
    function proveMalformedLog(JobId job, uint64 interval, uint64 step, uint32 op, LogRun calldata run) external;

    /// @notice The demand's record (reverts with `UnknownDemand`).
    /// @param id The demand.
    function getDemand(DemandId id) external view returns (Demand memory);

    /// @notice The op log size bound by the first answered run of (job, step, op); 0 before.
    /// @param job The job.
    /// @param step The step.
    /// @param op The op.
    function logSize(JobId job, uint64 step, uint32 op) external view returns (uint64);

    /// @notice The registry this contract settles through.
    function registry() external view returns (IJobRegistry);

    /// @notice Wei per gas of a demand's answer fee (deployment parameter, immutable).
    function feeGasPrice() external view returns (uint256);

    /// @notice The fee (wei) a Step demand from `firstOp` pays with its bond: feeGasPrice *
    ///         (ANSWER_BASE_GAS + GAS_PER_ROOT * (nSlots + page length)).
    /// @param job The job.
    /// @param firstOp First op log root of the page.
    function stepDemandFee(JobId job, uint32 firstOp) external view returns (uint256);

    /// @notice The fee (wei) a Log demand of [fromIndex, toIndex) pays with its bond: feeGasPrice *
    ///         (ANSWER_BASE_GAS + GAS_PER_LEAF * min(toIndex - fromIndex + 2, MAX_LOG_LEAVES)), or
    ///         a full page's (MAX_LOG_LEAVES) with a fixed `startPosition` (what the answer does
    ///         not use goes back to the demander).
    /// @param fromIndex First element index.
    /// @param toIndex End element index (exclusive).
    /// @param startPosition The demand's start position, or NO_POSITION.
    function logDemandFee(uint32 fromIndex, uint32 toIndex, uint64 startPosition) external view returns (uint256);

    /// @notice Number of demands made; ids run from 1 to demandCount().
    function demandCount() external view returns (uint64);
}
