// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;
// Block time is the protocol's clock by design (challenge windows, chess clocks): see docs/lint.md.
// solhint-disable not-rely-on-time

import {ChunkAdjudicator} from "contracts/ChunkAdjudicator.sol";
import {IAdjudicator} from "contracts/interfaces/IAdjudicator.sol";
import {IChunkAdjudicator} from "contracts/interfaces/IChunkAdjudicator.sol";
import {IDisputeGame} from "contracts/interfaces/IDisputeGame.sol";
import {IJobRegistry} from "contracts/interfaces/IJobRegistry.sol";
import {Bisection} from "contracts/lib/Bisection.sol";
import {ChunkedSum} from "contracts/lib/ChunkedSum.sol";
import {Clock, LibClock} from "contracts/lib/Clock.sol";
// GameTypes is the shared vocabulary (ids, structs, errors, constants) used throughout this contract.
// solhint-disable-next-line no-global-import
import "contracts/lib/GameTypes.sol";
import {Merkle} from "contracts/lib/Merkle.sol";

/// @title DisputeGame
/// @notice One trainer vs one challenger over one posted interval; many games per job. Descends
///         steps -> ops -> chunks -> one element and asks the adjudicator (see IDisputeGame).
/// @dev Holds no ETH: `challenge` forwards the bond to the registry, which settles every game.
///      Per move: access and turn checks, the clock, one check of the revealed data, events.
///      INVARIANT: while a game is InProgress exactly one clock runs, the one of `_toMove`.
contract DisputeGame is IDisputeGame {
    using Bisection for Descent;

    /// @inheritdoc IDisputeGame
    IJobRegistry public immutable registry;

    /// @inheritdoc IDisputeGame
    IAdjudicator public immutable adjudicator;

    /// @inheritdoc IDisputeGame
    IChunkAdjudicator public immutable chunkAdjudicator;

    /// @inheritdoc IDisputeGame
    uint64 public gameCount;

    mapping(GameId game => Game record) internal _games;

    /// @notice Binds the registry (escrow, settlement) and the adjudicator, both immutable.
    /// @param registry_ The JobRegistry; its deployer must then call `setDisputeGame(this)`.
    /// @param adjudicator_ The one-step adjudicator.
    constructor(IJobRegistry registry_, IAdjudicator adjudicator_) {
        registry = registry_;
        adjudicator = adjudicator_;
        chunkAdjudicator = new ChunkAdjudicator();
    }

    // ------------------------------------------------------------ moves

    /// @inheritdoc IDisputeGame
    function challenge(JobId job, uint64 interval) external payable returns (GameId game) {
        // SAFETY: the registry checks status, window and bond, and keeps the bond (this holds no ETH).
        (address trainer, bytes32 root, uint64 firstStep, uint64 size, uint64 clock) =
            registry.lockBond{value: msg.value}(job, interval, msg.sender);
        game = GameId.wrap(++gameCount);
        Game storage g = _games[game];
        g.job = job;
        g.interval = interval;
        g.phase = Phase.Steps;
        g.status = GameStatus.InProgress;
        g.trainer = trainer;
        g.challenger = msg.sender;
        g.trainerClock = LibClock.wrap(clock, uint64(block.timestamp));
        g.challengerClock = LibClock.wrap(clock, 0);
        g.descent.start(root, size);
        emit GameCreated(game, job, interval, trainer, msg.sender, root, firstStep, size);
    }

    /// @inheritdoc IDisputeGame
    function reveal(GameId game, bytes32 left, bytes32 right) external {
        Game storage g = _enter(game, Party.Trainer);
        Phase phase = g.phase;
        _expectBisection(game, phase);
        Descent storage d = g.descent;
        d.reveal(left, right);
        emit ChildrenRevealed(game, phase, d.lo, d.size, left, right);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function choose(GameId game, bool right) external {
        Game storage g = _enter(game, Party.Challenger);
        Phase phase = g.phase;
        _expectBisection(game, phase);
        (bytes32 root, uint64 lo, uint64 size) = g.descent.choose(right);
        emit ChildChosen(game, phase, right, lo, size, root);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function openStep(
        GameId game,
        bytes32[] calldata prevComponents,
        bytes32[] calldata components,
        bytes32 logRoot,
        bytes32 prevLogRoot,
        bytes32[] calldata prevProof
    ) external {
        Game storage g = _enter(game, Party.Trainer);
        _expectLeaf(game, g, Phase.Steps);
        JobParams memory p = registry.jobParams(g.job);
        // INVARIANT: a state root has exactly nSlots components (nSlots <= 1024 bounds rootOf).
        if (prevComponents.length != p.nSlots) revert WrongLength(prevComponents.length, p.nSlots);
        if (components.length != p.nSlots) revert WrongLength(components.length, p.nSlots);
        bytes32 prevStateRoot = Merkle.rootOf(prevComponents);
        bytes32 stateRoot = Merkle.rootOf(components);
        uint64 s = g.interval * p.intervalLength + g.descent.lo + 1;
        bytes32 leaf = Merkle.leafHash(abi.encodePacked(s, stateRoot, logRoot));
        // INVARIANT: the opened step is the disputed leaf (its position fixes s).
        if (leaf != g.descent.root) revert HashMismatch(g.descent.root, leaf);
        if (s == 1) {
            // INVARIANT: stateRoot_0 is the job's registered initial state.
            if (prevStateRoot != p.initialStateRoot) revert InitialStateMismatch(p.initialStateRoot, prevStateRoot);
        } else {
            // INVARIANT: stateRoot_{s-1} is the trainer's own commitment in step leaf s-1, which
            // the challenger agreed to (earlier leaf of this interval, or an earlier interval).
            uint64 prevIndex = s - 2;
            uint64 prevInterval = prevIndex / p.intervalLength;
            uint64 start = prevInterval * p.intervalLength;
            uint64 prevSize = p.nSteps - start < p.intervalLength ? p.nSteps - start : p.intervalLength;
            bytes32 prevLeaf = Merkle.leafHash(abi.encodePacked(s - 1, prevStateRoot, prevLogRoot));
            Merkle.verify(
                registry.getInterval(g.job, prevInterval).root, prevLeaf, prevIndex - start, prevSize, prevProof
            );
        }
        g.step = s;
        g.nOps = p.nOps;
        g.prevStateRoot = prevStateRoot;
        g.stateRoot = stateRoot;
        g.logRoot = logRoot;
        g.phase = Phase.TraceCommit;
        emit StepOpened(game, s, prevStateRoot, stateRoot, logRoot, prevComponents, components);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function commitTrace(GameId game, bytes32 traceRoot) external {
        Game storage g = _enter(game, Party.Trainer);
        if (g.phase != Phase.TraceCommit) revert WrongPhase(game, g.phase);
        // SAFETY: zero is never a root; a zero trace could never be opened anyway.
        if (traceRoot == bytes32(0)) revert ZeroRoot();
        g.traceRoot = traceRoot;
        g.phase = Phase.Trace;
        g.descent.start(traceRoot, g.nOps);
        emit TraceCommitted(game, traceRoot, g.nOps);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function openOp(GameId game, OpOpening calldata opening) external {
        OpOpening calldata o = opening;
        Game storage g = _enter(game, Party.Trainer);
        _expectLeaf(game, g, Phase.Trace);
        JobParams memory p = registry.jobParams(g.job);
        uint32 j = uint32(g.descent.lo);
        bytes32 outLeaf = Merkle.leafHash(abi.encodePacked(o.outRoot));
        // INVARIANT: the opened record is the disputed trace leaf j.
        if (outLeaf != g.descent.root) revert HashMismatch(g.descent.root, outLeaf);
        // INVARIANT: the op is op j of the job's graph, and its log root is the one in logRoot_s.
        Merkle.verify(p.graphRoot, Merkle.leafHash(o.descriptor), j, p.nOps, o.graphProof);
        Merkle.verify(g.logRoot, Merkle.leafHash(abi.encodePacked(o.opLogRoot)), j, p.nOps, o.logProof);
        (uint8 kind, uint32[] memory inputs, uint32[] memory shape,, uint256[] memory attrs) =
            abi.decode(o.descriptor, (uint8, uint32[], uint32[], uint32[][], uint256[]));
        _checkInputs(g, j, inputs, o.inputRoots, o.inputProofs);
        g.op = j;
        g.opLogRoot = o.opLogRoot;

        if (kind == KIND_INPUT || kind == KIND_OUTPUT || kind == KIND_CONST) {
            _checkBind(g, kind, o, attrs, p.nSlots);
            emit OpOpened(game, j, kind, o.outRoot, o.opLogRoot, o.descriptor, o.inputRoots, 0, 0);
            _resolve(game, g, Party.Trainer, Ruling.Bind);
            return;
        }
        uint256 numel = _numel(shape);
        if (numel == 0) {
            // INVARIANT: an empty tensor has exactly one root, the empty tree's; nothing to dispute.
            bytes32 empty = sha256("");
            if (o.outRoot != empty) revert BindMismatch(kind, empty, o.outRoot);
            emit OpOpened(game, j, kind, o.outRoot, o.opLogRoot, o.descriptor, o.inputRoots, 0, 0);
            _resolve(game, g, Party.Trainer, Ruling.Bind);
            return;
        }
        uint64 nChunks = uint64((numel + CHUNK_ELEMENTS - 1) / CHUNK_ELEMENTS);
        g.numel = uint64(numel);
        g.descriptorHash = keccak256(o.descriptor);
        g.inputRootsHash = keccak256(abi.encodePacked(o.inputRoots));
        g.phase = Phase.Element;
        g.descent.start(o.outRoot, nChunks);
        emit OpOpened(game, j, kind, o.outRoot, o.opLogRoot, o.descriptor, o.inputRoots, uint64(numel), nChunks);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function openChunk(GameId game, bytes calldata chunk) external {
        Game storage g = _enter(game, Party.Trainer);
        _expectLeaf(game, g, Phase.Element);
        uint64 c = g.descent.lo;
        uint256 rest = uint256(g.numel) - uint256(c) * CHUNK_ELEMENTS;
        uint256 expected = 4 * (rest < CHUNK_ELEMENTS ? rest : CHUNK_ELEMENTS);
        // INVARIANT: a chunk holds 64 elements, the last one the remainder (leaf data is fixed-size).
        if (chunk.length != expected) revert WrongLength(chunk.length, expected);
        bytes32 leaf = Merkle.leafHash(chunk);
        if (leaf != g.descent.root) revert HashMismatch(g.descent.root, leaf);
        g.phase = Phase.Pick;
        emit ChunkOpened(game, c, chunk);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function pickElement(GameId game, bytes calldata chunk, uint256 offset) external {
        Game storage g = _enter(game, Party.Challenger);
        if (g.phase != Phase.Pick) revert WrongPhase(game, g.phase);
        bytes32 leaf = Merkle.leafHash(chunk);
        // INVARIANT: the element is read from the chunk the trainer opened (its leaf hash).
        if (leaf != g.descent.root) revert HashMismatch(g.descent.root, leaf);
        if (offset >= chunk.length / 4) revert OffsetOutOfRange(offset, chunk.length / 4);
        uint256 b = 4 * offset;
        uint32 claimed = uint32(uint8(chunk[b])) | (uint32(uint8(chunk[b + 1])) << 8)
            | (uint32(uint8(chunk[b + 2])) << 16) | (uint32(uint8(chunk[b + 3])) << 24);
        uint64 index = g.descent.lo * uint64(CHUNK_ELEMENTS) + uint64(offset);
        g.index = index;
        g.claimed = claimed;
        g.phase = Phase.OneStep;
        emit ElementPicked(game, index, claimed);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function oneStep(GameId game, bytes calldata descriptor, bytes32[] calldata inputRoots, bytes calldata proof)
        external
    {
        Game storage g = _party(game, Phase.OneStep, Phase.OneStep);
        IAdjudicator.ElementClaim memory claim = _claim(g, descriptor, inputRoots);
        uint256 n = chunkAdjudicator.terms(descriptor);
        // INVARIANT: a long reduction is ruled through the chunk level (postPartials), never at once.
        if (n > ChunkedSum.MAX_DIRECT_TERMS) revert ChunkedElement(n, ChunkedSum.MAX_DIRECT_TERMS);
        // SAFETY: a view call (STATICCALL), so no reentrancy; a revert (bad proof, out of gas)
        // propagates and leaves the game unchanged.
        bool trainerRight = adjudicator.adjudicate(claim, proof);
        _resolve(game, g, trainerRight ? Party.Trainer : Party.Challenger, Ruling.Adjudicated);
    }

    /// @inheritdoc IDisputeGame
    function postPartials(GameId game, bytes calldata descriptor, Partial[] calldata partials) external {
        Game storage g = _enter(game, Party.Trainer);
        if (g.phase != Phase.OneStep) revert WrongPhase(game, g.phase);
        bytes32 dh = keccak256(descriptor);
        if (dh != g.descriptorHash) revert OpeningMismatch(g.descriptorHash, dh);
        uint256 n = chunkAdjudicator.terms(descriptor);
        if (n <= ChunkedSum.MAX_DIRECT_TERMS) revert NotChunked(n, ChunkedSum.MAX_DIRECT_TERMS);
        // SAFETY: at most MAX_CHUNKS partials, each bounded, so every later sum fits (ChunkedSum.check).
        ChunkedSum.check(partials, n);
        g.partialsHash = keccak256(abi.encode(partials));
        g.phase = Phase.Partials;
        emit PartialsPosted(game, g.index, n, partials);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function disputeChunk(GameId game, Partial[] calldata partials, uint64 chunk) external {
        Game storage g = _enter(game, Party.Challenger);
        if (g.phase != Phase.Partials) revert WrongPhase(game, g.phase);
        _checkPartials(g, partials);
        if (chunk >= partials.length) revert ChunkOutOfRange(chunk, partials.length);
        g.chunk = chunk;
        g.phase = Phase.ChunkCheck;
        emit ChunkDisputed(game, chunk);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function acceptPartials(GameId game) external {
        Game storage g = _enter(game, Party.Challenger);
        if (g.phase != Phase.Partials) revert WrongPhase(game, g.phase);
        g.phase = Phase.PartialsRule;
        emit PartialsAccepted(game);
        _startClock(g);
    }

    /// @inheritdoc IDisputeGame
    function settlePartials(
        GameId game,
        bytes calldata descriptor,
        bytes32[] calldata inputRoots,
        Partial[] calldata partials,
        bytes calldata proof
    ) external {
        Game storage g = _party(game, Phase.ChunkCheck, Phase.PartialsRule);
        IAdjudicator.ElementClaim memory claim = _claim(g, descriptor, inputRoots);
        _checkPartials(g, partials);
        // SAFETY: view calls (STATICCALL); a revert leaves the game unchanged.
        bool trainerRight = g.phase == Phase.ChunkCheck
            ? chunkAdjudicator.checkChunk(claim, partials, g.chunk, proof)
            : chunkAdjudicator.ruleFromPartials(claim, partials, proof);
        _resolve(game, g, trainerRight ? Party.Trainer : Party.Challenger, Ruling.Adjudicated);
    }

    /// @inheritdoc IDisputeGame
    function claimTimeout(GameId game) external {
        Game storage g = _live(game);
        Party p = _toMove(g);
        Clock c = p == Party.Trainer ? g.trainerClock : g.challengerClock;
        // INVARIANT: the side to move may still move at its deadline second.
        if (!c.expired(block.timestamp)) revert ClockNotExpired(p, c.deadline(), block.timestamp);
        _resolve(game, g, p == Party.Trainer ? Party.Challenger : Party.Trainer, Ruling.Timeout);
    }

    /// @inheritdoc IDisputeGame
    function closeGame(GameId game) external {
        Game storage g = _game(game);
        if (g.status != GameStatus.InProgress) revert GameOver(game, g.status);
        JobStatus js = registry.jobStatus(g.job);
        // INVARIANT: only a job proven fraudulent elsewhere releases bonds without a winner.
        if (js != JobStatus.Fraudulent) revert JobNotFraudulent(g.job, js);
        g.status = GameStatus.Closed;
        g.phase = Phase.Done;
        registry.refundGame(g.job, g.challenger);
        emit GameClosed(game, g.job);
    }

    // ------------------------------------------------------------ views

    /// @inheritdoc IDisputeGame
    function getGame(GameId game) external view returns (GameView memory v) {
        Game storage g = _game(game);
        Party p = _toMove(g);
        v.job = g.job;
        v.interval = g.interval;
        v.trainer = g.trainer;
        v.challenger = g.challenger;
        v.phase = g.phase;
        v.status = g.status;
        v.toMove = p;
        if (p == Party.Trainer) v.deadline = g.trainerClock.deadline();
        if (p == Party.Challenger) v.deadline = g.challengerClock.deadline();
        v.trainerTime = g.trainerClock.remaining(block.timestamp);
        v.challengerTime = g.challengerClock.remaining(block.timestamp);
        v.root = g.descent.root;
        v.lo = g.descent.lo;
        v.size = g.descent.size;
        v.left = g.descent.left;
        v.right = g.descent.right;
        v.step = g.step;
        v.prevStateRoot = g.prevStateRoot;
        v.stateRoot = g.stateRoot;
        v.logRoot = g.logRoot;
        v.traceRoot = g.traceRoot;
        v.op = g.op;
        v.opLogRoot = g.opLogRoot;
        v.numel = g.numel;
        v.index = g.index;
        v.claimed = g.claimed;
        v.chunk = g.chunk;
    }

    /// @inheritdoc IDisputeGame
    function toMove(GameId game) external view returns (Party) {
        return _toMove(_game(game));
    }

    // ------------------------------------------------------------ internals

    function _game(GameId id) internal view returns (Game storage g) {
        g = _games[id];
        if (g.status == GameStatus.None) revert UnknownGame(id);
    }

    /// @dev A game that can still be played: in progress on an Active job.
    function _live(GameId id) internal view returns (Game storage g) {
        g = _game(id);
        if (g.status != GameStatus.InProgress) revert GameOver(id, g.status);
        JobStatus js = registry.jobStatus(g.job);
        // INVARIANT: once a job is Fraudulent its other games only close (bond refunded).
        if (js != JobStatus.Active) revert WrongJobStatus(g.job, js, JobStatus.Active);
    }

    /// @dev Checks that `mover` is to move and is the sender, and charges the elapsed time to its clock.
    function _enter(GameId id, Party mover) internal returns (Game storage g) {
        g = _live(id);
        Party p = _toMove(g);
        if (p != mover) revert NotYourTurn(msg.sender, p);
        address expected = mover == Party.Trainer ? g.trainer : g.challenger;
        if (msg.sender != expected) revert NotYourTurn(msg.sender, p);
        // SAFETY: `stop` reverts with ClockExpired after the deadline; the last second is valid.
        if (mover == Party.Trainer) g.trainerClock = g.trainerClock.stop(block.timestamp);
        else g.challengerClock = g.challengerClock.stop(block.timestamp);
    }

    /// @dev A ruling move (either party, the trainer's clock runs): checks the phase and the sender
    ///      and stops the trainer's clock (reverts after its deadline; then: claimTimeout).
    function _party(GameId id, Phase a, Phase b) internal returns (Game storage g) {
        g = _live(id);
        if (g.phase != a && g.phase != b) revert WrongPhase(id, g.phase);
        // INVARIANT: only the two parties ask for the ruling (either may: the truth does not
        // depend on who asks); the trainer's clock bounds the phase.
        if (msg.sender != g.trainer && msg.sender != g.challenger) revert Unauthorized(msg.sender, g.trainer);
        g.trainerClock = g.trainerClock.stop(block.timestamp);
    }

    /// @dev The picked element's claim, with the descriptor and input roots opened by `openOp`.
    function _claim(Game storage g, bytes calldata descriptor, bytes32[] calldata inputRoots)
        internal
        view
        returns (IAdjudicator.ElementClaim memory)
    {
        bytes32 dh = keccak256(descriptor);
        if (dh != g.descriptorHash) revert OpeningMismatch(g.descriptorHash, dh);
        bytes32 ih = keccak256(abi.encodePacked(inputRoots));
        if (ih != g.inputRootsHash) revert OpeningMismatch(g.inputRootsHash, ih);
        JobParams memory p = registry.jobParams(g.job);
        return IAdjudicator.ElementClaim({
            descriptor: descriptor,
            inputRoots: inputRoots,
            index: g.index,
            claimed: g.claimed,
            opLogRoot: g.opLogRoot,
            step: g.step,
            dataRoot: p.dataRoot,
            dataSeed: p.dataSeed,
            nSamples: p.nSamples
        });
    }

    /// @dev Reverts unless `partials` are the ones the trainer posted (their stored hash).
    function _checkPartials(Game storage g, Partial[] calldata partials) internal view {
        bytes32 h = keccak256(abi.encode(partials));
        if (h != g.partialsHash) revert OpeningMismatch(g.partialsHash, h);
    }

    /// @dev Starts the clock of the side to move after a move.
    function _startClock(Game storage g) internal {
        Party p = _toMove(g);
        if (p == Party.Trainer) g.trainerClock = g.trainerClock.start(block.timestamp);
        else if (p == Party.Challenger) g.challengerClock = g.challengerClock.start(block.timestamp);
    }

    /// @dev Whose move it is: trainer reveals, opens and commits; challenger chooses and picks.
    function _toMove(Game storage g) internal view returns (Party) {
        if (g.status != GameStatus.InProgress) return Party.None;
        Phase phase = g.phase;
        if (phase == Phase.Steps || phase == Phase.Trace || phase == Phase.Element) {
            Descent storage d = g.descent;
            return (!d.isLeaf() && d.isRevealed()) ? Party.Challenger : Party.Trainer;
        }
        if (phase == Phase.Pick || phase == Phase.Partials) return Party.Challenger;
        return Party.Trainer; // TraceCommit, OneStep, ChunkCheck, PartialsRule
    }

    function _resolve(GameId id, Game storage g, Party winner, Ruling ruling) internal {
        g.status = winner == Party.Trainer ? GameStatus.TrainerWon : GameStatus.ChallengerWon;
        g.phase = Phase.Done;
        emit GameResolved(id, g.job, winner, ruling);
        registry.settleGame(g.job, g.challenger, winner == Party.Trainer);
    }

    function _expectBisection(GameId id, Phase phase) internal pure {
        if (phase != Phase.Steps && phase != Phase.Trace && phase != Phase.Element) revert WrongPhase(id, phase);
    }

    function _expectLeaf(GameId id, Game storage g, Phase phase) internal view {
        if (g.phase != phase) revert WrongPhase(id, g.phase);
        if (!g.descent.isLeaf()) revert NotALeaf(g.descent.size);
    }

    /// @dev Proves each input root against the trace root at its op id (an earlier, agreed op).
    function _checkInputs(
        Game storage g,
        uint32 j,
        uint32[] memory inputs,
        bytes32[] calldata inputRoots,
        bytes32[][] calldata inputProofs
    ) internal view {
        uint256 n = inputs.length;
        // SAFETY: bounds the proof loop.
        if (n > MAX_OP_INPUTS) revert DescriptorOutOfBounds("inputs", n, MAX_OP_INPUTS);
        if (inputRoots.length != n) revert WrongLength(inputRoots.length, n);
        if (inputProofs.length != n) revert WrongLength(inputProofs.length, n);
        bytes32 traceRoot = g.traceRoot;
        uint32 nOps = g.nOps;
        for (uint256 k = 0; k < n; ++k) {
            // INVARIANT: only records before j are agreed (the challenger chose the first disputed op).
            if (inputs[k] >= j) revert InputNotBefore(inputs[k], j);
            Merkle.verify(traceRoot, Merkle.leafHash(abi.encodePacked(inputRoots[k])), inputs[k], nOps, inputProofs[k]);
        }
    }

    /// @dev Reverts unless the bind op's output root is what it is bound to.
    function _checkBind(Game storage g, uint8 kind, OpOpening calldata o, uint256[] memory attrs, uint32 nSlots)
        internal
        view
    {
        if (attrs.length == 0) revert DescriptorOutOfBounds("attrs", 0, 1);
        if (kind == KIND_CONST) {
            bytes32 bound = bytes32(attrs[0]);
            if (o.outRoot != bound) revert BindMismatch(kind, bound, o.outRoot);
            return;
        }
        bytes32 stateRoot = g.prevStateRoot;
        if (kind == KIND_OUTPUT) {
            // INVARIANT: OUTPUT copies its (agreed) input into stateRoot_s.
            if (o.inputRoots.length == 0) revert DescriptorOutOfBounds("inputs", 0, 1);
            if (o.outRoot != o.inputRoots[0]) revert BindMismatch(kind, o.inputRoots[0], o.outRoot);
            stateRoot = g.stateRoot;
        }
        Merkle.verify(stateRoot, Merkle.leafHash(abi.encodePacked(o.outRoot)), attrs[0], nSlots, o.bindProof);
    }

    /// @dev Product of the shape, bounded so that the chunk count fits a descent.
    function _numel(uint32[] memory shape) internal pure returns (uint256 numel) {
        // SAFETY: bounds the loop.
        if (shape.length > MAX_RANK) revert DescriptorOutOfBounds("rank", shape.length, MAX_RANK);
        numel = 1;
        for (uint256 i = 0; i < shape.length; ++i) {
            if (shape[i] == 0) return 0;
            // SAFETY: numel <= 2^63 here and a dim is < 2^32, so the product cannot overflow.
            numel *= shape[i];
            // SAFETY: numel, the flat index (< numel + 64) and the chunk count are stored as uint64.
            if (numel > MAX_NUMEL) revert DescriptorOutOfBounds("numel", numel, MAX_NUMEL);
        }
    }
}
