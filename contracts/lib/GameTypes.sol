// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Clock} from "contracts/lib/Clock.sol";

// Value types, enums, structs and errors shared by JobRegistry, DisputeGame and their libraries.
// Defined once here; the interfaces import them rather than repeating them.

/// @notice Id of a job in the JobRegistry; ids start at 1 (0 is "no job").
type JobId is uint64;

/// @notice Id of a dispute game in the DisputeGame contract; ids start at 1 (0 is "no game").
type GameId is uint64;

/// @notice Life cycle of a job.
/// @dev None -> Open (created, paid) -> Active (trainer staked) -> Finalized | Fraudulent;
///      Open -> Cancelled (client refunded before the trainer accepted). Fraudulent also ends a
///      job the client reclaimed because an interval was overdue (`reclaimJob`).
enum JobStatus {
    None,
    Open,
    Active,
    Cancelled,
    Finalized,
    Fraudulent
}

/// @notice Stage of a dispute game (what the next move is about).
/// @dev Steps:       bisect the interval tree; at a leaf the trainer calls `openStep`.
///      TraceCommit: the trainer calls `commitTrace`.
///      Trace:       bisect the trace tree (nOps leaves); at a leaf the trainer calls `openOp`.
///      Element:     bisect the op's output tensor tree (chunks); at a leaf the trainer calls `openChunk`.
///      Pick:        the challenger calls `pickElement`.
///      OneStep:     either party calls `oneStep` (the trainer's clock runs); for a reduction of more
///                   than ChunkedSum.MAX_DIRECT_TERMS terms the trainer calls `postPartials` instead.
///      Done:        resolved or closed; no more moves.
///      Partials:    the challenger calls `disputeChunk` or `acceptPartials`.
///      ChunkCheck:  either party calls `settlePartials` (disputed chunk recomputed; trainer's clock).
///      PartialsRule: either party calls `settlePartials` (element ruled from the partials; trainer's clock).
///      (The chunk level's phases come after Done so that the earlier values stay as they were.)
enum Phase {
    None,
    Steps,
    TraceCommit,
    Trace,
    Element,
    Pick,
    OneStep,
    Done,
    Partials,
    ChunkCheck,
    PartialsRule
}

/// @notice A side of a game.
enum Party {
    None,
    Trainer,
    Challenger
}

/// @notice Final state of a game.
enum GameStatus {
    None,
    InProgress,
    TrainerWon,
    ChallengerWon,
    Closed
}

/// @notice Why a game ended.
/// @dev Timeout: the side to move ran out of time. Bind: the trainer proved an INPUT, OUTPUT or
///      CONST op record (or an empty tensor). Adjudicated: the adjudicator ruled on one element.
///      JobFraudulent: another game proved the job fraudulent; the bond was returned.
enum Ruling {
    None,
    Timeout,
    Bind,
    Adjudicated,
    JobFraudulent
}

/// @notice What a client registers and pays for. All fields are immutable once created.
/// @param trainer The only address that may accept the job and post intervals.
/// @param specHash sha256 of the canonical training spec JSON.
/// @param dataRoot Dataset root (one leaf per sample).
/// @param dataSeed Data-order seed.
/// @param nSamples Number of samples under dataRoot (>= 1).
/// @param graphRoot Root of the op descriptors of one training step.
/// @param nOps Number of ops in the graph (>= 1).
/// @param nSlots Number of state components (1..1024).
/// @param initialStateRoot stateRoot_0.
/// @param nSteps Number of training steps N (>= 1).
/// @param intervalLength Steps per posted interval K (>= 1).
/// @param trainerStake Exact value the trainer locks with `acceptJob`.
/// @param challengerBond Exact value a challenger locks per game.
/// @param challengeWindow Seconds during which an interval can be challenged, counted from its
///        window start: its posting, or one postingPeriod after the previous interval's window start,
///        whichever is later (Interval.windowStart).
/// @param clock Seconds on each party's chess clock per game.
/// @param postingPeriod Seconds the trainer has per interval: interval i is due by
///        acceptedAt + (i + 1) * postingPeriod; once the next one is overdue the client may
///        reclaim the job (payment and the bounty to the client, the rest of the stake burned).
/// @param acceptPeriod Seconds, counted from `createJob`, during which the offer is firm: until
///        createdAt + acceptPeriod (the accept deadline, inclusive) the named trainer may accept and
///        the client cannot cancel; after it the trainer can no longer accept and the client may
///        cancel. So a trainer that trains the job before it stakes (its pre-training) knows how
///        long the payment stays on offer (1..MAX_ACCEPT_PERIOD).
struct JobParams {
    address trainer;
    bytes32 specHash;
    bytes32 dataRoot;
    bytes32 dataSeed;
    uint64 nSamples;
    bytes32 graphRoot;
    uint32 nOps;
    uint32 nSlots;
    bytes32 initialStateRoot;
    uint64 nSteps;
    uint64 intervalLength;
    uint128 trainerStake;
    uint128 challengerBond;
    uint64 challengeWindow;
    uint64 clock;
    uint64 postingPeriod;
    uint64 acceptPeriod;
}

/// @notice A job's registry record.
/// @param params The client's parameters.
/// @param client Who created and paid for the job (refunded on cancel or fraud).
/// @param payment Wei paid by the client.
/// @param status Life-cycle status.
/// @param nextInterval Number of intervals posted so far (the next index to post).
/// @param openGames Games on this job that are neither resolved nor closed.
/// @param acceptedAt Unix time of `acceptJob` (0 before).
/// @param createdAt Unix time of `createJob` (the accept deadline is createdAt + acceptPeriod).
struct Job {
    JobParams params;
    address client;
    uint128 payment;
    JobStatus status;
    uint64 nextInterval;
    uint32 openGames;
    uint64 acceptedAt;
    uint64 createdAt;
}

/// @notice One posted interval.
/// @param root RFC 9162 root over the interval's step leaves.
/// @param postedAt Unix time of posting.
/// @param windowStart Start of the interval's challenge window on the chained schedule: interval 0's
///        is its postedAt (>= acceptedAt), interval i's max(postedAt_i, windowStart_{i-1} + postingPeriod)
///        (so never before acceptedAt + i * postingPeriod, and intervals posted together start one
///        posting period apart). The window is open from posting until windowStart + challengeWindow
///        (IJobRegistry.unextendedWindowEnd), extensions aside. uint192: the chain may pass 2^64.
struct Interval {
    bytes32 root;
    uint64 postedAt;
    uint192 windowStart;
}

/// @notice A node of an RFC 9162 tree under bisection, with its revealed children.
/// @param root Hash of the current node (of the whole tree at the start; a leaf hash at the end).
/// @param left Revealed left child, 0 until the trainer reveals (a revealed child is never 0).
/// @param right Revealed right child, 0 until the trainer reveals.
/// @param lo Index of the node's first leaf in the whole tree.
/// @param size Number of leaves under the node; the node is a leaf when size == 1.
struct Descent {
    bytes32 root;
    bytes32 left;
    bytes32 right;
    uint64 lo;
    uint64 size;
}

/// @notice Everything the trainer reveals when it opens op j of the trace (`DisputeGame.openOp`).
/// @param outRoot Output tensor root of op j (its trace record).
/// @param descriptor abi.encode(uint8 kind, uint32[] inputs, uint32[] shape, uint32[][] inShapes, uint256[] attrs).
/// @param graphProof Inclusion path of leafHash(descriptor) at j in the job's graph root (size nOps).
/// @param opLogRoot The op's rounding-log root.
/// @param logProof Inclusion path of leafHash(opLogRoot) at j in logRoot_s (size nOps).
/// @param inputRoots Output roots of the op's inputs, in descriptor order.
/// @param inputProofs Inclusion path of each input root at its op id in the trace root (size nOps).
/// @param bindProof For INPUT/OUTPUT ops: inclusion path of leafHash(outRoot) at `slot` in
///        stateRoot_{s-1} / stateRoot_s (size nSlots); empty otherwise.
struct OpOpening {
    bytes32 outRoot;
    bytes descriptor;
    bytes32[] graphProof;
    bytes32 opLogRoot;
    bytes32[] logProof;
    bytes32[] inputRoots;
    bytes32[][] inputProofs;
    bytes32[] bindProof;
}

/// @notice One chunk's share of a long reduction's exact accumulation (ExactSum, docs/protocol.md
///         "Chunk level"): terms `[c * CHUNK_TERMS, min((c + 1) * CHUNK_TERMS, n))` of the element,
///         in quanta `2^L` with `L = E - 372`, `E` the largest `maxExp` over all of the element's chunks.
/// @param maxExp Largest term exponent `est` among the chunk's non-zero terms (0: all terms are zero).
/// @param sum Sum of the chunk's terms, each floored to the quantum, in quanta.
/// @param absSum Sum of the chunk's |terms| (floored), in quanta: the chunk's share of `S` for `dc`.
/// @param inexact Number of the chunk's terms with bits below the quantum.
/// @param tail The exact rest of the chunk's terms below the quantum (ExactSum.tailAt at the
///             element's scale): all zero when `inexact` is 0; decides a ruling whose enclosure
///             holds an FP32 midpoint.
struct Partial {
    uint256 maxExp;
    int256 sum;
    uint256 absSum;
    uint256 inexact;
    int256[4] tail;
}

/// @notice A game's storage record (DisputeGame).
/// @dev Slot layout (packed): [job, interval, step, phase, status] [trainer, op, nOps] [challenger]
///      [trainerClock, challengerClock] [descent: 4 slots] [7 opened roots] [numel, index, claimed]
///      [partialsHash] [chunk]. Fields after `descent` are zero until the move that opens them.
struct Game {
    JobId job;
    uint64 interval;
    uint64 step;
    Phase phase;
    GameStatus status;
    address trainer;
    uint32 op;
    uint32 nOps;
    address challenger;
    Clock trainerClock;
    Clock challengerClock;
    Descent descent;
    bytes32 prevStateRoot;
    bytes32 stateRoot;
    bytes32 logRoot;
    bytes32 traceRoot;
    bytes32 opLogRoot;
    bytes32 descriptorHash;
    bytes32 inputRootsHash;
    uint64 numel;
    uint64 index;
    uint32 claimed;
    bytes32 partialsHash;
    uint64 chunk;
}

// ---------------------------------------------------------------- op kinds bound by the game

/// @dev Descriptor kind of an op whose output is component `attrs[0]` of stateRoot_{s-1}.
uint8 constant KIND_INPUT = 0;
/// @dev Descriptor kind of an op copying its input into component `attrs[0]` of stateRoot_s.
uint8 constant KIND_OUTPUT = 1;
/// @dev Descriptor kind of an op whose output root is `bytes32(attrs[0])`.
uint8 constant KIND_CONST = 3;
/// @dev Elements per tensor chunk (one leaf of a tensor root).
uint256 constant CHUNK_ELEMENTS = 64;
/// @dev Most inputs an opened op may have (bounds the proof loop).
uint256 constant MAX_OP_INPUTS = 16;
/// @dev Highest tensor rank an opened op may have (bounds the numel loop).
uint256 constant MAX_RANK = 16;
/// @dev Most elements an opened op's output may have (flat indices fit in uint64).
uint256 constant MAX_NUMEL = 2 ** 63;
/// @dev Most state components of a job (Merkle.rootOf's bound).
uint256 constant MAX_SLOTS = 1024;
/// @dev Longest acceptPeriod of a job (365 days): the client's payment is locked that long at most
///      if the trainer never answers; a period in milliseconds by mistake (1 day = 86,400,000) is refused.
uint256 constant MAX_ACCEPT_PERIOD = 365 days;

// ---------------------------------------------------------------- errors: registry

/// @notice Thrown when a job id does not exist.
error UnknownJob(JobId job);
/// @notice Thrown when a job is not in the status the call needs.
error WrongJobStatus(JobId job, JobStatus status, JobStatus expected);
/// @notice Thrown when a job parameter is out of range.
/// @param field Name of the parameter.
/// @param value Offending value.
error InvalidJobParam(string field, uint256 value);
/// @notice Thrown when a job's term is below the floor the registry was deployed with.
/// @param term Name of the JobParams field (challengeWindow, clock, postingPeriod, challengerBond).
/// @param value The job's value.
/// @param floor The least value the registry accepts.
error TermBelowFloor(string term, uint256 value, uint256 floor);
/// @notice Thrown by the registry's constructor when a deployment parameter is out of range.
/// @param param Name of the parameter.
/// @param value Offending value.
error InvalidDeployment(string param, uint256 value);
/// @notice Thrown when the caller is not the party the call is reserved for.
error Unauthorized(address caller, address expected);
/// @notice Thrown when the ETH sent is not the exact amount required.
error WrongValue(uint256 sent, uint256 expected);
/// @notice Thrown when an interval is posted out of order or past the last one.
/// @param index Interval index given.
/// @param expected Next interval index to post.
/// @param nIntervals Number of intervals of the job.
error WrongInterval(uint64 index, uint64 expected, uint64 nIntervals);
/// @notice Thrown when a posted or revealed root is zero (never a hash).
error ZeroRoot();
/// @notice Thrown when an interval is challenged that has not been posted.
error IntervalNotPosted(JobId job, uint64 index, uint64 posted);
/// @notice Thrown when an interval is challenged after its challenge window.
error WindowClosed(JobId job, uint64 index, uint256 windowEnd, uint256 now_);
/// @notice Thrown when a job is finalized while intervals are still unposted.
error IntervalsMissing(JobId job, uint64 posted, uint64 nIntervals);
/// @notice Thrown when a job is finalized before the last challenge window ended.
error WindowStillOpen(JobId job, uint256 windowEnd, uint256 now_);
/// @notice Thrown when a job is finalized while games are open on it.
error GamesOpen(JobId job, uint32 openGames);
/// @notice Thrown when `withdraw` is called with nothing owed.
error NothingOwed(address account);
/// @notice Thrown when a payout transfer fails (the credit is kept).
error TransferFailed(address to, uint256 amount);
/// @notice Thrown when a job is reclaimed while its next interval is not yet overdue (or all are posted).
/// @param index The next interval to post (nIntervals when all are posted).
/// @param deadline Last second at which interval `index` may be posted before the job can be reclaimed.
error PostingNotOverdue(JobId job, uint64 index, uint256 deadline, uint256 now_);
/// @notice Thrown when a client cancels its job while the trainer may still accept it.
/// @param acceptDeadline Last second at which the trainer may accept (createdAt + acceptPeriod);
///        the client may cancel from the second after.
error CancelTooEarly(JobId job, uint256 acceptDeadline, uint256 now_);
/// @notice Thrown when a trainer accepts a job after its accept deadline (the offer has expired).
/// @param acceptDeadline Last second at which the trainer could accept (createdAt + acceptPeriod).
error AcceptDeadlinePassed(JobId job, uint256 acceptDeadline, uint256 now_);
/// @notice Thrown when the dispute game is already set or is the zero address.
error GameAlreadySet(address game);
/// @notice Thrown when the availability contract is already set or is the zero address.
error AvailabilityAlreadySet(address availability);
/// @notice Thrown when a window extension goes past the unextended window end + 2 * clock.
error ExtensionTooLong(JobId job, uint64 index, uint256 until, uint256 cap);

// ---------------------------------------------------------------- errors: game

/// @notice Thrown when a game id does not exist.
error UnknownGame(GameId game);
/// @notice Thrown when a move is made on a game that is over.
error GameOver(GameId game, GameStatus status);
/// @notice Thrown when a move is not the one the game's phase expects.
error WrongPhase(GameId game, Phase phase);
/// @notice Thrown when a party moves out of turn or a third party moves.
/// @param caller The sender.
/// @param toMove The party whose move it is.
error NotYourTurn(address caller, Party toMove);
/// @notice Thrown when `claimTimeout` is called before the side to move ran out of time.
error ClockNotExpired(Party toMove, uint256 deadline, uint256 now_);
/// @notice Thrown when `closeGame` is called on a game whose job is not fraudulent.
error JobNotFraudulent(JobId job, JobStatus status);
/// @notice Thrown when a revealed or opened value does not hash to the node under dispute.
error HashMismatch(bytes32 expected, bytes32 actual);
/// @notice Thrown when a node with fewer than two leaves is bisected.
error NotBisectable(uint64 size);
/// @notice Thrown when the node under dispute is not a leaf but a leaf opening was attempted.
error NotALeaf(uint64 size);
/// @notice Thrown when children are revealed twice or chosen before being revealed.
error RevealState(bool revealed);
/// @notice Thrown when an array has the wrong length.
error WrongLength(uint256 length, uint256 expected);
/// @notice Thrown when the components of stateRoot_{s-1} do not hash to the agreed root (s == 1).
error InitialStateMismatch(bytes32 expected, bytes32 actual);
/// @notice Thrown when an opened op reads an input that is not an earlier op (not agreed).
error InputNotBefore(uint32 input, uint32 op);
/// @notice Thrown when a bind op's output root does not equal what it is bound to.
error BindMismatch(uint8 kind, bytes32 expected, bytes32 actual);
/// @notice Thrown when an op's descriptor is out of the game's bounds (too many inputs, rank, size).
error DescriptorOutOfBounds(string what, uint256 value, uint256 max);
/// @notice Thrown when a picked element is outside the opened chunk.
error OffsetOutOfRange(uint256 offset, uint256 elements);
/// @notice Thrown when the descriptor or input roots given to `oneStep` are not the ones opened.
error OpeningMismatch(bytes32 expected, bytes32 actual);
/// @notice Thrown when `postPartials` is called for an element short enough for `oneStep`.
error NotChunked(uint256 terms, uint256 maxDirect);
/// @notice Thrown when `oneStep` is called for a reduction longer than `maxDirect` terms (post partials).
error ChunkedElement(uint256 terms, uint256 maxDirect);
/// @notice Thrown when a disputed chunk is not one of the posted partials.
error ChunkOutOfRange(uint256 chunk, uint256 nChunks);
