// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;
// Block time is the protocol's clock by design (challenge windows, chess clocks): see docs/lint.md.
// solhint-disable not-rely-on-time

import {IJobRegistry} from "contracts/interfaces/IJobRegistry.sol";
// GameTypes is the shared vocabulary (ids, structs, errors, constants) used throughout this contract.
// solhint-disable-next-line no-global-import
import "contracts/lib/GameTypes.sol";

/// @title JobRegistry
/// @notice Job registry and escrow of verifiable training; the DisputeGame settles through it.
/// @dev Holds every wei of the protocol: client payments, trainer stakes, challenger bonds and the
///      burned part of convicted stakes. The game contract holds none. Thin contract: access
///      checks, state, credits and events. The floors on the terms and the bounty fraction are
///      deployment parameters (docs/security.md, "Terms and economics").
contract JobRegistry is IJobRegistry {
    /// @dev Basis points of a whole (bountyBps is a fraction of BPS).
    uint256 internal constant BPS = 10_000;

    /// @notice Address allowed to bind the dispute game once.
    address public immutable deployer;

    /// @inheritdoc IJobRegistry
    uint64 public immutable minChallengeWindow;

    /// @inheritdoc IJobRegistry
    uint64 public immutable minClock;

    /// @inheritdoc IJobRegistry
    uint64 public immutable minPostingPeriod;

    /// @inheritdoc IJobRegistry
    uint128 public immutable minChallengerBond;

    /// @inheritdoc IJobRegistry
    uint16 public immutable bountyBps;

    /// @inheritdoc IJobRegistry
    address public disputeGame;

    /// @inheritdoc IJobRegistry
    address public availability;

    /// @inheritdoc IJobRegistry
    uint64 public jobCount;

    /// @inheritdoc IJobRegistry
    uint256 public totalOwed;

    /// @inheritdoc IJobRegistry
    uint256 public totalBurned;

    /// @inheritdoc IJobRegistry
    mapping(address account => uint256 amount) public owed;

    mapping(JobId job => Job record) internal _jobs;
    mapping(JobId job => mapping(uint64 index => Interval interval)) internal _intervals;
    /// @dev Challenge-window ends moved later by `extendWindow` (0: not extended). uint256: a
    ///      chained window start (Interval.windowStart) may pass 2^64.
    mapping(JobId job => mapping(uint64 index => uint256 end)) internal _extendedEnd;
    /// @dev Latest extended window end over the job's intervals (finalize waits for it).
    mapping(JobId job => uint256 end) internal _lastExtendedEnd;
    /// @dev Answer fees of the job's open availability demands (part of its escrow).
    mapping(JobId job => uint256 amount) internal _feesHeld;

    /// @notice Deploys the registry with its floors on the terms and its bounty fraction (immutable).
    /// @param minChallengeWindow_ Least `challengeWindow` of a job, seconds (>= 1).
    /// @param minClock_ Least `clock` of a job, seconds (>= 1).
    /// @param minPostingPeriod_ Least `postingPeriod` of a job, seconds (>= 1).
    /// @param minChallengerBond_ Least `challengerBond` of a job, wei (>= 1).
    /// @param bountyBps_ Part of a convicted trainer's stake paid to the winner, in basis points
    ///        (1..9999); the rest is burned.
    constructor(
        uint64 minChallengeWindow_,
        uint64 minClock_,
        uint64 minPostingPeriod_,
        uint128 minChallengerBond_,
        uint16 bountyBps_
    ) {
        // SAFETY: a zero floor would let a job have zero-second terms or a free challenge.
        if (minChallengeWindow_ == 0) revert InvalidDeployment("minChallengeWindow", 0);
        if (minClock_ == 0) revert InvalidDeployment("minClock", 0);
        if (minPostingPeriod_ == 0) revert InvalidDeployment("minPostingPeriod", 0);
        if (minChallengerBond_ == 0) revert InvalidDeployment("minChallengerBond", 0);
        // SAFETY: a bounty of 0 pays no honest auditor; a bounty of the whole stake lets a trainer
        // convicted by its own sybil challenger recover all of it.
        if (bountyBps_ == 0 || bountyBps_ >= BPS) revert InvalidDeployment("bountyBps", bountyBps_);
        deployer = msg.sender;
        minChallengeWindow = minChallengeWindow_;
        minClock = minClock_;
        minPostingPeriod = minPostingPeriod_;
        minChallengerBond = minChallengerBond_;
        bountyBps = bountyBps_;
    }

    modifier onlyAuthorized() {
        // INVARIANT: only the bound game or the bound availability contract lock and settle bonds.
        if (msg.sender == address(0) || (msg.sender != disputeGame && msg.sender != availability)) {
            revert Unauthorized(msg.sender, disputeGame);
        }
        _;
    }

    modifier onlyAvailability() {
        // INVARIANT: only the bound availability contract releases demand bonds and extends windows.
        if (msg.sender != availability || msg.sender == address(0)) revert Unauthorized(msg.sender, availability);
        _;
    }

    // ------------------------------------------------------------ client and trainer

    /// @inheritdoc IJobRegistry
    function createJob(JobParams calldata params) external payable returns (JobId job) {
        _validate(params);
        job = JobId.wrap(++jobCount);
        Job storage j = _jobs[job];
        j.params = params;
        j.client = msg.sender;
        // SAFETY: msg.value fits in uint128 (total ETH supply is far below 2^128 wei).
        j.payment = uint128(msg.value);
        j.status = JobStatus.Open;
        j.createdAt = uint64(block.timestamp);
        emit JobCreated(job, msg.sender, params.trainer, params, msg.value, block.timestamp + params.acceptPeriod);
    }

    /// @inheritdoc IJobRegistry
    function cancelJob(JobId job) external {
        Job storage j = _job(job);
        // INVARIANT: only the payer takes its payment back, and only before the trainer staked.
        if (msg.sender != j.client) revert Unauthorized(msg.sender, j.client);
        _expectStatus(job, j.status, JobStatus.Open);
        // INVARIANT: the offer is firm until the accept deadline: a trainer training the job before
        // it stakes cannot see the payment taken back mid-way (no second where both cancel and
        // accept succeed: accept needs now <= deadline, cancel now > deadline).
        uint256 deadline = _acceptDeadline(j);
        if (block.timestamp <= deadline) revert CancelTooEarly(job, deadline, block.timestamp);
        j.status = JobStatus.Cancelled;
        uint256 refund = j.payment;
        _credit(j.client, job, refund);
        emit JobCancelled(job, refund);
    }

    /// @inheritdoc IJobRegistry
    function acceptJob(JobId job) external payable {
        Job storage j = _job(job);
        // INVARIANT: the client named the trainer; nobody else can stake in its place.
        if (msg.sender != j.params.trainer) revert Unauthorized(msg.sender, j.params.trainer);
        _expectStatus(job, j.status, JobStatus.Open);
        // INVARIANT: an expired offer cannot be taken: the client, free to cancel from the next
        // second, is never held past the deadline it chose.
        uint256 deadline = _acceptDeadline(j);
        if (block.timestamp > deadline) revert AcceptDeadlinePassed(job, deadline, block.timestamp);
        // INVARIANT: escrow of an Active job is exactly payment + stake (+ bonds).
        if (msg.value != j.params.trainerStake) revert WrongValue(msg.value, j.params.trainerStake);
        j.status = JobStatus.Active;
        j.acceptedAt = uint64(block.timestamp);
        emit JobAccepted(job, msg.sender, msg.value);
    }

    /// @inheritdoc IJobRegistry
    function postInterval(JobId job, uint64 index, bytes32 root) external {
        Job storage j = _job(job);
        if (msg.sender != j.params.trainer) revert Unauthorized(msg.sender, j.params.trainer);
        _expectStatus(job, j.status, JobStatus.Active);
        uint64 n = _nIntervals(j.params);
        // INVARIANT: in order, no gaps, no overwrite, nothing past the last interval.
        if (index != j.nextInterval || index >= n) revert WrongInterval(index, j.nextInterval, n);
        // SAFETY: a zero root would read as "not posted".
        if (root == bytes32(0)) revert ZeroRoot();
        // The chained schedule: interval 0's window starts now (>= acceptedAt), interval i's at the
        // later of now and one posting period after interval i-1's start. So start_i >= acceptedAt
        // + i * postingPeriod (posting early never shortens a window), and overdue intervals posted
        // together still get windows one posting period apart.
        uint256 start = block.timestamp;
        if (index != 0) {
            uint256 scheduled = uint256(_intervals[job][index - 1].windowStart) + j.params.postingPeriod;
            if (scheduled > start) start = scheduled;
        }
        // SAFETY: start <= max(timestamps) + index * postingPeriod < 2^64 + 2^128 < 2^192.
        _intervals[job][index] =
            Interval({root: root, postedAt: uint64(block.timestamp), windowStart: uint192(start)});
        j.nextInterval = index + 1;
        (uint64 firstStep, uint64 size) = _span(j.params, index);
        emit IntervalPosted(job, index, root, firstStep, size, start + j.params.challengeWindow);
    }

    /// @inheritdoc IJobRegistry
    function finalize(JobId job) external {
        Job storage j = _job(job);
        _expectStatus(job, j.status, JobStatus.Active);
        uint64 n = _nIntervals(j.params);
        if (j.nextInterval != n) revert IntervalsMissing(job, j.nextInterval, n);
        // INVARIANT: every interval's window has closed. Unextended windows close in index order
        // (their chained starts increase by at least postingPeriod >= 1 with the index), so the
        // last interval's closes last; an answered availability demand may have extended an
        // earlier one (_lastExtendedEnd: the latest extension over all intervals).
        uint256 end = _baseWindowEnd(j, _intervals[job][n - 1]);
        uint256 ext = _lastExtendedEnd[job];
        if (ext > end) end = ext;
        if (block.timestamp <= end) revert WindowStillOpen(job, end, block.timestamp);
        // INVARIANT: a game still running could yet prove fraud.
        if (j.openGames != 0) revert GamesOpen(job, j.openGames);
        j.status = JobStatus.Finalized;
        uint256 payout = uint256(j.payment) + j.params.trainerStake;
        _credit(j.params.trainer, job, payout);
        emit JobFinalized(job, payout);
    }

    /// @inheritdoc IJobRegistry
    function reclaimJob(JobId job) external {
        Job storage j = _job(job);
        // INVARIANT: only the payer decides to stop waiting for overdue work.
        if (msg.sender != j.client) revert Unauthorized(msg.sender, j.client);
        _expectStatus(job, j.status, JobStatus.Active);
        uint64 next = j.nextInterval;
        uint256 deadline = _postingDeadline(j, next);
        // INVARIANT: a trainer that posted every interval, or is not yet late, keeps the job.
        if (next >= _nIntervals(j.params) || block.timestamp <= deadline) {
            revert PostingNotOverdue(job, next, deadline, block.timestamp);
        }
        // INVARIANT: a game still running could yet prove fraud; its challenger, not the client
        // (possibly the trainer's own sybil), is owed the bounty then.
        if (j.openGames != 0) revert GamesOpen(job, j.openGames);
        // A missed deadline is a fault like a proven fraud: the client (the one who proved it, with
        // no bond) gets its payment and the bounty, the rest of the stake is burned.
        uint256 bounty = _convict(job, j.client, 0);
        emit JobReclaimed(job, next, uint256(j.payment) + bounty);
    }

    /// @inheritdoc IJobRegistry
    function withdraw() external {
        uint256 amount = owed[msg.sender];
        if (amount == 0) revert NothingOwed(msg.sender);
        // SAFETY: effects before the interaction; a reentrant withdraw finds nothing owed.
        owed[msg.sender] = 0;
        totalOwed -= amount;
        emit Withdrawn(msg.sender, amount);
        (bool ok,) = msg.sender.call{value: amount}("");
        // SAFETY: a failed transfer reverts everything, so the credit is kept.
        if (!ok) revert TransferFailed(msg.sender, amount);
    }

    // ------------------------------------------------------------ dispute game hooks

    /// @inheritdoc IJobRegistry
    function setDisputeGame(address game) external {
        if (msg.sender != deployer) revert Unauthorized(msg.sender, deployer);
        // INVARIANT: the game is bound once; a swapped game could settle games it never ran.
        if (disputeGame != address(0) || game == address(0)) revert GameAlreadySet(disputeGame);
        disputeGame = game;
        emit DisputeGameSet(game);
    }

    /// @inheritdoc IJobRegistry
    function lockBond(JobId job, uint64 index, address challenger)
        external
        payable
        onlyAuthorized
        returns (address trainer, bytes32 root, uint64 firstStep, uint64 size, uint64 clock)
    {
        return _lock(job, index, challenger, 0);
    }

    /// @inheritdoc IJobRegistry
    function lockDemand(JobId job, uint64 index, address demander, uint256 fee)
        external
        payable
        onlyAvailability
        returns (address trainer, bytes32 root, uint64 firstStep, uint64 size, uint64 clock)
    {
        // INVARIANT: escrow of an Active job = payment + stake + open bonds + held fees.
        _feesHeld[job] += fee;
        return _lock(job, index, demander, fee);
    }

    /// @dev Locks `challengerBond + fee` (msg.value) for a new game or demand on posted interval `index`.
    function _lock(JobId job, uint64 index, address challenger, uint256 fee)
        internal
        returns (address trainer, bytes32 root, uint64 firstStep, uint64 size, uint64 clock)
    {
        Job storage j = _job(job);
        _expectStatus(job, j.status, JobStatus.Active);
        // INVARIANT: only posted intervals can be disputed.
        if (index >= j.nextInterval) revert IntervalNotPosted(job, index, j.nextInterval);
        Interval storage iv = _intervals[job][index];
        uint256 end = _windowEnd(job, j, index);
        // INVARIANT: the window includes its last second, as the clocks do.
        if (block.timestamp > end) revert WindowClosed(job, index, end, block.timestamp);
        uint256 due = uint256(j.params.challengerBond) + fee;
        if (msg.value != due) revert WrongValue(msg.value, due);
        // INVARIANT: finalize waits for this game (openGames != 0).
        j.openGames += 1;
        (firstStep, size) = _span(j.params, index);
        emit BondLocked(job, challenger, index, j.params.challengerBond);
        return (j.params.trainer, iv.root, firstStep, size, j.params.clock);
    }

    /// @inheritdoc IJobRegistry
    function settleGame(JobId job, address challenger, bool trainerWon) external onlyAuthorized {
        Job storage j = _job(job);
        _expectStatus(job, j.status, JobStatus.Active);
        j.openGames -= 1;
        uint256 bond = j.params.challengerBond;
        if (trainerWon) {
            _credit(j.params.trainer, job, bond);
        } else {
            // INVARIANT: the first won game (job still Active) convicts; later games find the job
            // Fraudulent and are closed with their bond back.
            _convict(job, challenger, bond);
        }
        emit GameSettled(job, challenger, trainerWon, false);
    }

    /// @inheritdoc IJobRegistry
    function refundGame(JobId job, address challenger) external onlyAuthorized {
        Job storage j = _job(job);
        _expectStatus(job, j.status, JobStatus.Fraudulent);
        j.openGames -= 1;
        _credit(challenger, job, j.params.challengerBond);
        emit GameSettled(job, challenger, false, true);
    }

    // ------------------------------------------------------------ availability hooks

    /// @inheritdoc IJobRegistry
    function setAvailability(address da) external {
        if (msg.sender != deployer) revert Unauthorized(msg.sender, deployer);
        // INVARIANT: bound once; a swapped contract could release bonds or convict at will.
        if (availability != address(0) || da == address(0)) revert AvailabilityAlreadySet(availability);
        availability = da;
        emit AvailabilitySet(da);
    }

    /// @inheritdoc IJobRegistry
    function releaseDemand(JobId job, address demander, uint256 fee, uint256 earned) external onlyAvailability {
        Job storage j = _job(job);
        _expectStatus(job, j.status, JobStatus.Active);
        j.openGames -= 1;
        // SAFETY: checked arithmetic: more than the held fee, or earned > fee, reverts.
        _feesHeld[job] -= fee;
        uint256 refunded = fee - earned;
        _credit(demander, job, uint256(j.params.challengerBond) + refunded);
        // INVARIANT: the trainer is paid for an answer only once it is given (pull payment).
        _credit(j.params.trainer, job, earned);
        emit BondReleased(job, demander, j.params.challengerBond);
        emit DemandFeeSettled(job, demander, earned, refunded);
    }

    /// @inheritdoc IJobRegistry
    function refundFee(JobId job, address demander, uint256 fee) external onlyAvailability {
        Job storage j = _job(job);
        // INVARIANT: fees are held only while the job is Active, and refunded on a Fraudulent one.
        if (j.status != JobStatus.Active && j.status != JobStatus.Fraudulent) {
            revert WrongJobStatus(job, j.status, JobStatus.Active);
        }
        _feesHeld[job] -= fee;
        _credit(demander, job, fee);
        emit DemandFeeSettled(job, demander, 0, fee);
    }

    /// @inheritdoc IJobRegistry
    function extendWindow(JobId job, uint64 index, uint256 until) external onlyAvailability {
        Job storage j = _job(job);
        _expectStatus(job, j.status, JobStatus.Active);
        if (index >= j.nextInterval) revert IntervalNotPosted(job, index, j.nextInterval);
        uint256 base = _baseWindowEnd(j, _intervals[job][index]);
        // SAFETY: demands are made inside the unextended window (the same base: DataAvailability
        // reads unextendedWindowEnd) and answered within one clock, so an honest extension never
        // passes base + 2 * clock; nothing can push finalize further.
        uint256 cap = base + 2 * uint256(j.params.clock);
        if (until > cap) revert ExtensionTooLong(job, index, until, cap);
        if (until <= _windowEnd(job, j, index)) return;
        _extendedEnd[job][index] = until;
        if (until > _lastExtendedEnd[job]) _lastExtendedEnd[job] = until;
        emit WindowExtended(job, index, until);
    }

    /// @inheritdoc IJobRegistry
    function convict(JobId job, address winner) external onlyAvailability {
        Job storage j = _job(job);
        _expectStatus(job, j.status, JobStatus.Active);
        _convict(job, winner, 0);
    }

    // ------------------------------------------------------------ views

    /// @inheritdoc IJobRegistry
    function getJob(JobId job) external view returns (Job memory) {
        return _job(job);
    }

    /// @inheritdoc IJobRegistry
    function jobParams(JobId job) external view returns (JobParams memory) {
        return _job(job).params;
    }

    /// @inheritdoc IJobRegistry
    function jobStatus(JobId job) external view returns (JobStatus) {
        return _jobs[job].status;
    }

    /// @inheritdoc IJobRegistry
    function nIntervals(JobId job) external view returns (uint64) {
        return _nIntervals(_job(job).params);
    }

    /// @inheritdoc IJobRegistry
    function intervalSpan(JobId job, uint64 index) external view returns (uint64 firstStep, uint64 size) {
        JobParams storage p = _job(job).params;
        uint64 n = _nIntervals(p);
        if (index >= n) revert WrongInterval(index, index, n);
        return _span(p, index);
    }

    /// @inheritdoc IJobRegistry
    function getInterval(JobId job, uint64 index) external view returns (Interval memory) {
        return _intervals[job][index];
    }

    /// @inheritdoc IJobRegistry
    function windowEnd(JobId job, uint64 index) external view returns (uint256) {
        if (_intervals[job][index].root == bytes32(0)) return 0;
        return _windowEnd(job, _jobs[job], index);
    }

    /// @inheritdoc IJobRegistry
    function unextendedWindowEnd(JobId job, uint64 index) external view returns (uint256) {
        Interval storage iv = _intervals[job][index];
        if (iv.root == bytes32(0)) return 0;
        return _baseWindowEnd(_jobs[job], iv);
    }

    /// @inheritdoc IJobRegistry
    function postingDeadline(JobId job, uint64 index) external view returns (uint256) {
        Job storage j = _job(job);
        if (j.acceptedAt == 0) return 0;
        return _postingDeadline(j, index);
    }

    /// @inheritdoc IJobRegistry
    function acceptDeadline(JobId job) external view returns (uint256) {
        return _acceptDeadline(_job(job));
    }

    /// @inheritdoc IJobRegistry
    function escrowOf(JobId job) external view returns (uint256) {
        Job storage j = _jobs[job];
        uint256 bonds = uint256(j.openGames) * j.params.challengerBond + _feesHeld[job];
        if (j.status == JobStatus.Open) return j.payment;
        if (j.status == JobStatus.Active) return uint256(j.payment) + j.params.trainerStake + bonds;
        if (j.status == JobStatus.Fraudulent) return bonds;
        return 0;
    }

    // ------------------------------------------------------------ internals

    function _job(JobId job) internal view returns (Job storage j) {
        j = _jobs[job];
        if (j.status == JobStatus.None) revert UnknownJob(job);
    }

    function _expectStatus(JobId job, JobStatus status, JobStatus expected) internal pure {
        if (status != expected) revert WrongJobStatus(job, status, expected);
    }

    /// @notice Convicts `job`: the single payout of a proven fault.
    /// @dev Ends an Active job as Fraudulent: the client is credited its payment, `winner` its `bond`
    ///      plus the bounty (`bountyBps` of the stake), and the rest of the stake is burned (kept
    ///      here, counted in `totalBurned`, never credited). The one place a fault is paid out:
    ///      a won game (bond = challengerBond), a reclaim (winner = client, bond 0), and any other
    ///      fraud proof. Callers check the job is Active and take `bond` into escrow beforehand.
    /// @return bounty The part of the stake credited to `winner`.
    function _convict(JobId job, address winner, uint256 bond) internal returns (uint256 bounty) {
        Job storage j = _jobs[job];
        // INVARIANT: a job is convicted once; its stake is paid out once.
        _expectStatus(job, j.status, JobStatus.Active);
        j.status = JobStatus.Fraudulent;
        uint256 stake = j.params.trainerStake;
        // SAFETY: stake < 2^128 and bountyBps < 2^16: no overflow; bounty <= stake.
        bounty = (stake * bountyBps) / BPS;
        uint256 burned = stake - bounty;
        // INVARIANT: balance = totalOwed + totalBurned + sum of escrow; the burned part leaves
        // escrow for good (a sybil challenger recovers at most the bounty).
        totalBurned += burned;
        _credit(winner, job, bond + bounty);
        _credit(j.client, job, j.payment);
        emit JobFraudulent(job, winner, bond + bounty, j.payment, burned);
    }

    /// @dev Last second interval `index` can be challenged: its unextended end, or later if extended.
    function _windowEnd(JobId job, Job storage j, uint64 index) internal view returns (uint256 end) {
        end = _baseWindowEnd(j, _intervals[job][index]);
        uint256 ext = _extendedEnd[job][index];
        if (ext > end) end = ext;
    }

    /// @dev Unextended end of posted interval `iv`'s window: its stored chained start (set by
    ///      postInterval) + challengeWindow.
    ///      SAFETY: starts are at least one posting period apart and never before acceptedAt +
    ///      index * postingPeriod, so a trainer that posts every interval at once, early or overdue,
    ///      cannot make the auditors replay several intervals inside one window: an auditor
    ///      replaying one interval per posting period keeps up.
    function _baseWindowEnd(Job storage j, Interval storage iv) internal view returns (uint256) {
        return uint256(iv.windowStart) + j.params.challengeWindow;
    }

    function _credit(address account, JobId job, uint256 amount) internal {
        if (amount == 0) return;
        owed[account] += amount;
        totalOwed += amount;
        emit Credited(account, job, amount);
    }

    /// @dev Last second at which the trainer may accept, and the client may not cancel, the job.
    function _acceptDeadline(Job storage j) internal view returns (uint256) {
        return uint256(j.createdAt) + j.params.acceptPeriod;
    }

    function _postingDeadline(Job storage j, uint64 index) internal view returns (uint256) {
        return uint256(j.acceptedAt) + (uint256(index) + 1) * j.params.postingPeriod;
    }

    function _nIntervals(JobParams storage p) internal view returns (uint64) {
        return (p.nSteps + p.intervalLength - 1) / p.intervalLength;
    }

    function _span(JobParams storage p, uint64 index) internal view returns (uint64 firstStep, uint64 size) {
        uint64 start = index * p.intervalLength;
        firstStep = start + 1;
        uint64 left = p.nSteps - start;
        size = left < p.intervalLength ? left : p.intervalLength;
    }

    function _validate(JobParams calldata p) internal view {
        if (p.trainer == address(0)) revert InvalidJobParam("trainer", 0);
        if (p.nOps == 0) revert InvalidJobParam("nOps", 0);
        if (p.nSlots == 0 || p.nSlots > MAX_SLOTS) revert InvalidJobParam("nSlots", p.nSlots);
        if (p.nSteps == 0) revert InvalidJobParam("nSteps", 0);
        if (p.intervalLength == 0) revert InvalidJobParam("intervalLength", 0);
        if (p.nSamples == 0) revert InvalidJobParam("nSamples", 0);
        // SAFETY: an auditor needs time to fetch and replay an interval before its window closes.
        if (p.challengeWindow < minChallengeWindow) {
            revert TermBelowFloor("challengeWindow", p.challengeWindow, minChallengeWindow);
        }
        // SAFETY: with a short clock, an honest party whose move lands a few blocks late loses on
        // timeout (a client colluding with a challenger could pick a 1-second clock).
        if (p.clock < minClock) revert TermBelowFloor("clock", p.clock, minClock);
        // SAFETY: without a posting period a trainer that never posts locks the payment forever;
        // with a short one, an honest trainer delayed a few blocks could be reclaimed.
        if (p.postingPeriod < minPostingPeriod) {
            revert TermBelowFloor("postingPeriod", p.postingPeriod, minPostingPeriod);
        }
        // SAFETY: a free (or near-free) challenge costs a griefer nothing while the trainer pays
        // gas to defend it.
        if (p.challengerBond < minChallengerBond) {
            revert TermBelowFloor("challengerBond", p.challengerBond, minChallengerBond);
        }
        // SAFETY: a zero period would let the client cancel at once (no firm offer); past the cap
        // the client's own payment would be locked for years (a period in milliseconds by mistake).
        if (p.acceptPeriod == 0 || p.acceptPeriod > MAX_ACCEPT_PERIOD) {
            revert InvalidJobParam("acceptPeriod", p.acceptPeriod);
        }
        // SAFETY: nSteps + K - 1 in _nIntervals must not overflow uint64.
        if (p.nSteps > type(uint64).max - p.intervalLength) revert InvalidJobParam("nSteps", p.nSteps);
        if (p.initialStateRoot == bytes32(0)) revert InvalidJobParam("initialStateRoot", 0);
        if (p.graphRoot == bytes32(0)) revert InvalidJobParam("graphRoot", 0);
    }
}
