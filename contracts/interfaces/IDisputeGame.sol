// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IAdjudicator} from "contracts/interfaces/IAdjudicator.sol";
import {IChunkAdjudicator} from "contracts/interfaces/IChunkAdjudicator.sol";
import {IJobRegistry} from "contracts/interfaces/IJobRegistry.sol";
import {GameId, JobId, OpOpening, Partial, Party, Phase, GameStatus, Ruling} from "contracts/lib/GameTypes.sol";

/// @title IDisputeGame
/// @notice Bisection game between a job's trainer and one challenger over one posted interval
///         (docs/protocol.md, "The game"). Levels, each an RFC 9162 descent (trainer reveals the two
///         children of the disputed node, challenger chooses one; a node of one leaf skips to the
///         open move):
///         1. Steps: the interval tree down to one step leaf s; the trainer `openStep`s it.
///         2. Trace: the trainer `commitTrace`s traceRoot_s; descent over its nOps leaves to op j;
///            the trainer `openOp`s it. INPUT, OUTPUT and CONST ops are ruled there (trainer wins
///            if it proves the bind; if it cannot, it cannot move and loses on time).
///         3. Element: descent over op j's output tensor tree (64-element chunks) to one chunk; the
///            trainer `openChunk`s it; the challenger `pickElement`s one element.
///         4. One step: either party calls `oneStep`; the adjudicator rules on the element.
///         Each party has a chess clock of the job's `clock` seconds; only the side to move burns
///         time; a move at the deadline second is valid; from the next second anyone may
///         `claimTimeout` and the other side wins. The game holds no ETH: bonds sit in the registry.
interface IDisputeGame {
    /// @notice A public snapshot of a game.
    /// @param toMove Side whose move it is (None once the game is over).
    /// @param deadline Last second at which `toMove` may move (0 once over).
    /// @param trainerTime Seconds left on the trainer's clock at this block.
    /// @param challengerTime Seconds left on the challenger's clock at this block.
    /// @param root Hash of the disputed node of the current descent.
    /// @param lo First leaf of the disputed node.
    /// @param size Leaves under the disputed node.
    /// @param left Revealed left child (0 until revealed).
    /// @param right Revealed right child (0 until revealed).
    /// @param chunk The chunk disputed at the chunk level (0 before `disputeChunk`).
    struct GameView {
        JobId job;
        uint64 interval;
        address trainer;
        address challenger;
        Phase phase;
        GameStatus status;
        Party toMove;
        uint256 deadline;
        uint64 trainerTime;
        uint64 challengerTime;
        bytes32 root;
        uint64 lo;
        uint64 size;
        bytes32 left;
        bytes32 right;
        uint64 step;
        bytes32 prevStateRoot;
        bytes32 stateRoot;
        bytes32 logRoot;
        bytes32 traceRoot;
        uint32 op;
        bytes32 opLogRoot;
        uint64 numel;
        uint64 index;
        uint32 claimed;
        uint64 chunk;
    }

    /// @notice Emitted when a game starts. The first move is the trainer's.
    /// @param root Interval root (the disputed node).
    /// @param firstStep Step of the interval's leaf 0.
    /// @param size Number of step leaves in the interval.
    event GameCreated(
        GameId indexed game,
        JobId indexed job,
        uint64 indexed interval,
        address trainer,
        address challenger,
        bytes32 root,
        uint64 firstStep,
        uint64 size
    );
    /// @notice Emitted when the trainer reveals the children of node (lo, size) in `phase`.
    event ChildrenRevealed(GameId indexed game, Phase phase, uint64 lo, uint64 size, bytes32 left, bytes32 right);
    /// @notice Emitted when the challenger chooses a child; (lo, size, root) is the new disputed node.
    event ChildChosen(GameId indexed game, Phase phase, bool right, uint64 lo, uint64 size, bytes32 root);
    /// @notice Emitted when the trainer opens step leaf `step` with both full states.
    event StepOpened(
        GameId indexed game,
        uint64 step,
        bytes32 prevStateRoot,
        bytes32 stateRoot,
        bytes32 logRoot,
        bytes32[] prevComponents,
        bytes32[] components
    );
    /// @notice Emitted when the trainer commits the trace root of the disputed step.
    event TraceCommitted(GameId indexed game, bytes32 traceRoot, uint32 nOps);
    /// @notice Emitted when the trainer opens op `op`. `nChunks` is 0 when the op was ruled as a bind.
    event OpOpened(
        GameId indexed game,
        uint32 op,
        uint8 kind,
        bytes32 outRoot,
        bytes32 opLogRoot,
        bytes descriptor,
        bytes32[] inputRoots,
        uint64 numel,
        uint64 nChunks
    );
    /// @notice Emitted when the trainer opens chunk `chunk` of the op's output (4 LE bytes per element).
    event ChunkOpened(GameId indexed game, uint64 chunk, bytes data);
    /// @notice Emitted when the challenger names the element at flat index `index`, claimed FP32 bits `claimed`.
    event ElementPicked(GameId indexed game, uint64 index, uint32 claimed);
    /// @notice Emitted when the trainer posts the partials of a long reduction element (`terms` terms,
    ///         one partial per chunk of ChunkedSum.CHUNK_TERMS terms).
    event PartialsPosted(GameId indexed game, uint64 index, uint256 terms, Partial[] partials);
    /// @notice Emitted when the challenger disputes the partial of chunk `chunk`.
    event ChunkDisputed(GameId indexed game, uint64 chunk);
    /// @notice Emitted when the challenger accepts the partials (the element is then ruled from them).
    event PartialsAccepted(GameId indexed game);
    /// @notice Emitted when a game ends with a winner.
    event GameResolved(GameId indexed game, JobId indexed job, Party winner, Ruling ruling);
    /// @notice Emitted when a game is closed because its job was proven fraudulent in another game.
    event GameClosed(GameId indexed game, JobId indexed job);

    /// @notice Opens a game on posted interval `interval` of `job`, sending exactly the job's
    ///         challengerBond; the caller is the challenger. Allowed while the job is Active and
    ///         the interval's challenge window is open (its last second included).
    /// @param job The job.
    /// @param interval Index of the posted interval.
    /// @return game The new game's id (ids start at 1).
    function challenge(JobId job, uint64 interval) external payable returns (GameId game);

    /// @notice Trainer: reveals the two children of the disputed node (Steps, Trace or Element);
    ///         nodeHash(left, right) must equal the node's hash.
    /// @param game The game.
    /// @param left Root of the node's first k leaves (k: the largest power of two below its size).
    /// @param right Root of the node's remaining leaves.
    function reveal(GameId game, bytes32 left, bytes32 right) external;

    /// @notice Challenger: descends into the revealed left (`right == false`) or right child.
    /// @param game The game.
    /// @param right True to dispute the right child, false for the left one.
    function choose(GameId game, bool right) external;

    /// @notice Trainer, at step leaf s (Steps phase, node of one leaf): opens the step.
    /// @dev Checks rootOf(prevComponents) = stateRoot_{s-1}: equal to the job's initialStateRoot
    ///      when s == 1, otherwise bound by step leaf s-1 = leafHash(uint64be(s-1) || stateRoot_{s-1}
    ///      || prevLogRoot) at index (s-2) % K of the interval holding step s-1, proven by prevProof.
    ///      Checks leafHash(uint64be(s) || rootOf(components) || logRoot) equals the disputed leaf.
    /// @param game The game.
    /// @param prevComponents The nSlots component roots of stateRoot_{s-1}.
    /// @param components The nSlots component roots of stateRoot_s.
    /// @param logRoot logRoot_s.
    /// @param prevLogRoot logRoot_{s-1} (ignored when s == 1).
    /// @param prevProof Inclusion path of step leaf s-1 (ignored when s == 1).
    function openStep(
        GameId game,
        bytes32[] calldata prevComponents,
        bytes32[] calldata components,
        bytes32 logRoot,
        bytes32 prevLogRoot,
        bytes32[] calldata prevProof
    ) external;

    /// @notice Trainer: commits traceRoot_s, the RFC 9162 root over the nOps output roots of step s.
    /// @param game The game.
    /// @param traceRoot The trace root.
    function commitTrace(GameId game, bytes32 traceRoot) external;

    /// @notice Trainer, at trace leaf j (Trace phase, node of one leaf): opens op j (see `OpOpening`).
    /// @dev Checks leafHash(outRoot) is the disputed leaf, the descriptor against the graph root
    ///      at j, opLogRoot against logRoot_s at j, every input (ids < j) against traceRoot. INPUT
    ///      (0): outRoot is component attrs[0] of stateRoot_{s-1}; CONST (3): outRoot ==
    ///      bytes32(attrs[0]); OUTPUT (1): outRoot == inputRoots[0] and is component attrs[0] of
    ///      stateRoot_s. Those, and an op with an empty output whose root is sha256(""), end the
    ///      game: the trainer wins. Any other op starts the Element descent over its output tree
    ///      (ceil(numel / 64) chunks).
    /// @param game The game.
    /// @param opening Op j's record, descriptor, log root, inputs and their proofs.
    function openOp(GameId game, OpOpening calldata opening) external;

    /// @notice Trainer, at chunk leaf c (Element phase, node of one leaf): reveals the chunk's bytes,
    ///         4 * min(64, numel - 64c) bytes, FP32 little-endian.
    /// @param game The game.
    /// @param chunk The chunk's leaf data.
    function openChunk(GameId game, bytes calldata chunk) external;

    /// @notice Challenger: names element `offset` of the opened chunk (passing the chunk bytes
    ///         again); the claimed value is the little-endian uint32 at 4 * offset.
    /// @param game The game.
    /// @param chunk The opened chunk's bytes (checked against the disputed leaf).
    /// @param offset Element within the chunk; the flat index is 64 * chunk + offset.
    function pickElement(GameId game, bytes calldata chunk, uint256 offset) external;

    /// @notice Either party: asks the adjudicator to rule on the picked element, giving the
    ///         descriptor and input roots opened by `openOp` and the adjudicator's proof. True ->
    ///         the trainer wins, false -> the challenger wins; a revert leaves the game unchanged.
    ///         The trainer's clock runs in this phase: if nobody gets a ruling in time, the trainer loses.
    /// @param game The game.
    /// @param descriptor The op's descriptor, as opened by `openOp`.
    /// @param inputRoots The op's input roots, as opened by `openOp`.
    /// @param proof The adjudicator's proof (input openings and the log entry).
    function oneStep(GameId game, bytes calldata descriptor, bytes32[] calldata inputRoots, bytes calldata proof)
        external;

    /// @notice Trainer, in phase OneStep, for a MATMUL/SUM/MEAN element of more than
    ///         ChunkedSum.MAX_DIRECT_TERMS terms (for which `oneStep` reverts): posts the element's
    ///         exact partial sums, one per chunk of ChunkedSum.CHUNK_TERMS terms (docs/protocol.md,
    ///         "Chunk level"). Only their hash is stored; the challenger moves next.
    /// @param game The game.
    /// @param descriptor The op's descriptor, as opened by `openOp`.
    /// @param partials One partial per chunk, in chunk order.
    function postPartials(GameId game, bytes calldata descriptor, Partial[] calldata partials) external;

    /// @notice Challenger, in phase Partials: disputes the partial of one chunk; the chunk is then
    ///         recomputed from the inputs by `settlePartials`.
    /// @param game The game.
    /// @param partials The posted partials (checked against the stored hash).
    /// @param chunk The disputed chunk.
    function disputeChunk(GameId game, Partial[] calldata partials, uint64 chunk) external;

    /// @notice Challenger, in phase Partials: accepts the posted partials; the element is then ruled
    ///         from their sum by `settlePartials`.
    /// @param game The game.
    function acceptPartials(GameId game) external;

    /// @notice Either party, in phase ChunkCheck or PartialsRule (the trainer's clock runs): asks the
    ///         chunk adjudicator for the ruling. ChunkCheck: the disputed chunk's partial is recomputed
    ///         (equal -> trainer wins, else challenger wins). PartialsRule: the element is ruled from
    ///         the partials with the rounding rule and its log entry. A revert leaves the game unchanged.
    /// @param game The game.
    /// @param descriptor The op's descriptor, as opened by `openOp`.
    /// @param inputRoots The op's input roots, as opened by `openOp`.
    /// @param partials The posted partials (checked against the stored hash).
    /// @param proof ChunkCheck: `abi.encode(Opening[])` of the chunk's input rows; PartialsRule:
    ///        `abi.encode(LogOpening)` of the element's log entry (see IChunkAdjudicator).
    function settlePartials(
        GameId game,
        bytes calldata descriptor,
        bytes32[] calldata inputRoots,
        Partial[] calldata partials,
        bytes calldata proof
    ) external;

    /// @notice Anyone: ends the game when the side to move has run out of time; the other side wins.
    /// @param game The game.
    function claimTimeout(GameId game) external;

    /// @notice Anyone: closes a game whose job became Fraudulent in another game; the challenger's
    ///         bond is refunded. Moves on such a game revert.
    /// @param game The game.
    function closeGame(GameId game) external;

    /// @notice The registry holding jobs and bonds.
    function registry() external view returns (IJobRegistry);

    /// @notice The one-step adjudicator.
    function adjudicator() external view returns (IAdjudicator);

    /// @notice The chunk level's adjudicator (deployed by this game's constructor).
    function chunkAdjudicator() external view returns (IChunkAdjudicator);

    /// @notice Number of games created; ids run from 1 to gameCount().
    function gameCount() external view returns (uint64);

    /// @notice A snapshot of a game at the current block (reverts with `UnknownGame`).
    /// @param game The game.
    function getGame(GameId game) external view returns (GameView memory);

    /// @notice Side whose move it is (None once the game is over).
    /// @param game The game.
    function toMove(GameId game) external view returns (Party);
}
