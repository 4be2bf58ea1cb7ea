// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Interval, Job, JobId, JobParams, JobStatus} from "contracts/lib/GameTypes.sol";

/// @title IJobRegistry
/// @notice Jobs and escrow of verifiable training. A client creates a job and pays for it, the
///         named trainer accepts it with a stake and posts one Merkle root per interval of K steps;
///         each interval can be challenged in the DisputeGame during its challenge window. After the
///         last window, with no game open and no fraud proven, the trainer is paid payment + stake.
///         A proven fault (a challenger wins a game, or the client reclaims an overdue job) makes
///         the job Fraudulent: the client is refunded its payment, the winner gets its bond back
///         plus a bounty of `bountyBps` of the stake, and the rest of the stake is burned (kept
///         here for good, counted in `totalBurned`), so a trainer convicted by its own sybil
///         recovers at most the bounty. Terms below the deployment's floors are rejected.
///         Every payout is a credit (`owed`) collected with `withdraw` (pull payments).
/// @dev Solvency invariant: the registry's balance equals `totalOwed()` plus `totalBurned()` plus
///      `escrowOf(job)` summed over all jobs, where escrowOf is payment (Open), payment + stake +
///      open bonds + held demand fees (Active), open bonds + held demand fees (Fraudulent), 0
///      (Cancelled, Finalized).
interface IJobRegistry {
    /// @notice Emitted when a client creates a job.
    /// @param acceptDeadline Last second at which the trainer may accept (createdAt + acceptPeriod);
    ///        the client may cancel only after it.
    event JobCreated(
        JobId indexed job,
        address indexed client,
        address indexed trainer,
        JobParams params,
        uint256 payment,
        uint256 acceptDeadline
    );
    /// @notice Emitted when the trainer accepts a job with its stake.
    event JobAccepted(JobId indexed job, address indexed trainer, uint256 stake);
    /// @notice Emitted when the client cancels a job that was not accepted by its accept deadline.
    event JobCancelled(JobId indexed job, uint256 refund);
    /// @notice Emitted when the trainer posts interval `index` covering steps firstStep..firstStep+size-1.
    /// @param windowEnd Last second at which the interval can be challenged (before any extension):
    ///        windowStart + challengeWindow, windowStart = max(postedAt, previous interval's windowStart
    ///        + postingPeriod) (interval 0: postedAt).
    event IntervalPosted(
        JobId indexed job, uint64 indexed index, bytes32 root, uint64 firstStep, uint64 size, uint256 windowEnd
    );
    /// @notice Emitted when the client reclaims a job whose interval `overdue` was not posted in time.
    /// @param refund Credited to the client (its payment + the bounty; the rest of the stake is burned).
    event JobReclaimed(JobId indexed job, uint64 overdue, uint256 refund);
    /// @notice Emitted when a job is finalized and the trainer credited.
    event JobFinalized(JobId indexed job, uint256 payout);
    /// @notice Emitted when a job is convicted: its first won game, or a reclaim (winner = client).
    /// @param winner Who proved the fault (the challenger; the client for a reclaim).
    /// @param reward Credited to the winner (its bond + the bounty, bountyBps of the stake).
    /// @param refund Credited to the client (its payment).
    /// @param burned The rest of the stake, burned (added to totalBurned).
    event JobFraudulent(
        JobId indexed job, address indexed winner, uint256 reward, uint256 refund, uint256 burned
    );
    /// @notice Emitted when the dispute game locks a challenger's bond for a new game.
    event BondLocked(JobId indexed job, address indexed challenger, uint64 indexed interval, uint256 bond);
    /// @notice Emitted when a game on the job ends (won by either side, or closed with a refund).
    event GameSettled(JobId indexed job, address indexed challenger, bool trainerWon, bool refunded);
    /// @notice Emitted on every credit to an account's pull-payment balance.
    event Credited(address indexed account, JobId indexed job, uint256 amount);
    /// @notice Emitted when an account withdraws what it is owed.
    event Withdrawn(address indexed account, uint256 amount);
    /// @notice Emitted once, when the deployer binds the dispute game.
    event DisputeGameSet(address game);
    /// @notice Emitted once, when the deployer binds the data-availability contract.
    event AvailabilitySet(address availability);
    /// @notice Emitted when an answered availability demand's bond is credited back to its demander.
    event BondReleased(JobId indexed job, address indexed demander, uint256 bond);
    /// @notice Emitted when a demand's answer fee (held since the demand) is paid out: `earned` to the
    ///         trainer (it answered), `refunded` back to the demander (unused part, or no answer).
    event DemandFeeSettled(JobId indexed job, address indexed demander, uint256 earned, uint256 refunded);
    /// @notice Emitted when an answered demand moves interval `index`'s challenge window to `windowEnd`.
    event WindowExtended(JobId indexed job, uint64 indexed index, uint256 windowEnd);

    // ------------------------------------------------------------ client and trainer

    /// @notice Creates a job; `msg.value` is the payment held in escrow.
    /// @dev Reverts with `InvalidJobParam` when trainer is zero, nOps/nSteps/intervalLength/
    ///      nSamples is zero, or nSlots is not in 1..1024; with `TermBelowFloor` when challengeWindow,
    ///      clock, postingPeriod or challengerBond is below the deployment's floor (`minChallengeWindow`,
    ///      `minClock`, `minPostingPeriod`, `minChallengerBond`); with `InvalidJobParam` when
    ///      acceptPeriod is 0 or above MAX_ACCEPT_PERIOD (365 days). The offer is firm until
    ///      `acceptDeadline` = now + acceptPeriod: the trainer may accept until then, the client may
    ///      cancel only after.
    /// @param params The job's immutable parameters.
    /// @return job The new job's id (ids start at 1).
    function createJob(JobParams calldata params) external payable returns (JobId job);

    /// @notice The client takes its payment back (credited) once the trainer has let the accept
    ///         deadline pass without accepting. Before it the offer is firm: a trainer may be training
    ///         the job to check it before staking, and a cancel would waste that compute for free.
    /// @dev Reverts with `Unauthorized` (not the client), `WrongJobStatus` (not Open) and
    ///      `CancelTooEarly(job, acceptDeadline, now)` while now <= acceptDeadline.
    /// @param job The job to cancel; must be Open and called by its client.
    function cancelJob(JobId job) external;

    /// @notice The job's trainer accepts it, sending exactly `trainerStake`; the job becomes Active.
    /// @dev Reverts with `Unauthorized` (not the trainer), `WrongJobStatus` (not Open), `WrongValue`
    ///      and `AcceptDeadlinePassed(job, acceptDeadline, now)` once now > acceptDeadline (the offer
    ///      expired: the client may cancel).
    /// @param job The job to accept; must be Open.
    function acceptJob(JobId job) external payable;

    /// @notice The trainer posts the root of interval `index` (steps index*K+1 .. min(index*K+K, nSteps)).
    /// @dev Intervals are posted in order without gaps; posted roots cannot be changed. Its
    ///      challenge window is open from now until `unextendedWindowEnd`: challengeWindow seconds
    ///      after its window start, the later of now and the previous interval's window start +
    ///      postingPeriod (interval 0: now). Chained so, windows start at least one posting period
    ///      apart: posting early, or posting overdue intervals together, never shortens the
    ///      auditors' time. Reverts with `WrongInterval`, `ZeroRoot`, `Unauthorized`,
    ///      `WrongJobStatus` (only while Active).
    /// @param job The job.
    /// @param index Must equal the number of intervals posted so far and be < nIntervals.
    /// @param root RFC 9162 root over the interval's step leaves.
    function postInterval(JobId job, uint64 index, bytes32 root) external;

    /// @notice Anyone finalizes an Active job whose intervals are all posted, whose every challenge
    ///         window (extensions included) has passed and that has no open game: the trainer is
    ///         credited payment + stake. The last window ends no earlier than acceptedAt +
    ///         (n - 1) * postingPeriod + challengeWindow, however early the intervals were posted,
    ///         and at least (n - 1 - i) posting periods after interval i was posted.
    /// @param job The job.
    function finalize(JobId job) external;

    /// @notice The client reclaims an Active job whose next interval is overdue (not posted by
    ///         `postingDeadline`) and that has no open game: the job becomes Fraudulent, the client
    ///         is credited its payment + the bounty (bountyBps of the stake) and the rest of the
    ///         stake is burned (the client may be the trainer's own sybil).
    /// @dev Reverts with `Unauthorized` (not the client), `WrongJobStatus` (not Active),
    ///      `PostingNotOverdue` (every interval posted, or the deadline not passed) and `GamesOpen`
    ///      (a game could yet convict the trainer: its challenger earns the bounty then).
    /// @param job The job.
    function reclaimJob(JobId job) external;

    /// @notice Sends the caller everything it is owed.
    /// @dev Checks-effects-interactions: the credit is zeroed before the transfer; reverts with
    ///      `NothingOwed` on a zero credit and `TransferFailed` (credit kept) if the call fails.
    function withdraw() external;

    // ------------------------------------------------------------ dispute game hooks

    /// @notice Binds the dispute game (once, by the deployer); only it may call the hooks below.
    /// @param game The DisputeGame contract.
    function setDisputeGame(address game) external;

    /// @notice Locks a challenger's bond (`msg.value` == challengerBond) for a new game on `index`.
    /// @dev Only the dispute game or the availability contract. Requires the job Active, the interval
    ///      posted and its (possibly extended) window open.
    /// @param job The job.
    /// @param index The challenged interval.
    /// @param challenger The challenger (for events and settlement).
    /// @return trainer The job's trainer.
    /// @return root The interval root.
    /// @return firstStep Step of the interval's leaf 0.
    /// @return size Number of step leaves in the interval.
    /// @return clock Seconds on each party's clock.
    function lockBond(JobId job, uint64 index, address challenger)
        external
        payable
        returns (address trainer, bytes32 root, uint64 firstStep, uint64 size, uint64 clock);

    /// @notice Settles a finished game: trainer won -> the bond is credited to the trainer; challenger
    ///         won -> the job becomes Fraudulent, the challenger is credited bond + bounty (bountyBps of
    ///         the stake), the client its payment, and the rest of the stake is burned.
    /// @dev Only the dispute game or the availability contract (an unanswered or malformed demand:
    ///      trainerWon false); the job must be Active.
    /// @param job The job.
    /// @param challenger The game's challenger.
    /// @param trainerWon The winner.
    function settleGame(JobId job, address challenger, bool trainerWon) external;

    /// @notice Refunds the bond of a game closed because the job became Fraudulent in another game.
    /// @dev Only the dispute game or the availability contract; the job must be Fraudulent.
    /// @param job The job.
    /// @param challenger The game's challenger.
    function refundGame(JobId job, address challenger) external;

    // ------------------------------------------------------------ availability hooks

    /// @notice Binds the data-availability contract (once, by the deployer). It may, like the game,
    ///         `lockBond`, `settleGame` (a timed-out demand convicts) and `refundGame`, and alone
    ///         `lockDemand`, `releaseDemand`, `refundFee`, `extendWindow` and `convict`.
    /// @param da The DataAvailability contract.
    function setAvailability(address da) external;

    /// @notice Locks a demander's bond and answer fee (`msg.value` == challengerBond + fee) for a new
    ///         availability demand on `index`; the demand counts as an open game.
    /// @dev Only the availability contract; the same checks as `lockBond`. The fee is held in the
    ///      job's escrow until `releaseDemand` or `refundFee`.
    /// @param job The job.
    /// @param index The interval demanded from.
    /// @param demander The demander.
    /// @param fee The answer fee (DataAvailability computes it from what is demanded).
    /// @return trainer The job's trainer.
    /// @return root The interval root.
    /// @return firstStep Step of the interval's leaf 0.
    /// @return size Number of step leaves in the interval.
    /// @return clock Seconds on the trainer's clock.
    function lockDemand(JobId job, uint64 index, address demander, uint256 fee)
        external
        payable
        returns (address trainer, bytes32 root, uint64 firstStep, uint64 size, uint64 clock);

    /// @notice An answered demand: the bond and `fee - earned` are credited back to the demander,
    ///         `earned` to the trainer (one open game fewer).
    /// @dev Only the availability contract; the job must be Active; `earned <= fee`.
    /// @param job The job.
    /// @param demander The demand's demander.
    /// @param fee The demand's fee, held since `lockDemand`.
    /// @param earned The part of it the answer earned the trainer.
    function releaseDemand(JobId job, address demander, uint256 fee, uint256 earned) external;

    /// @notice An unanswered demand, one whose answer convicted the trainer, or one closed on a
    ///         Fraudulent job: its whole fee is credited back to the demander (the bond is settled by
    ///         `settleGame` or `refundGame`).
    /// @dev Only the availability contract; the job must be Active or Fraudulent.
    /// @param job The job.
    /// @param demander The demand's demander.
    /// @param fee The demand's fee, held since `lockDemand`.
    function refundFee(JobId job, address demander, uint256 fee) external;

    /// @notice Moves the end of interval `index`'s challenge window to `until` if that is later, so an
    ///         auditor has time to replay data published near the window's end.
    /// @dev Only the availability contract; the job must be Active. Reverts with `ExtensionTooLong`
    ///      past the unextended window end (`unextendedWindowEnd`) + 2 * clock (finalize is delayed by
    ///      at most 2 * clock).
    /// @param job The job.
    /// @param index A posted interval.
    /// @param until The new last second of the window.
    function extendWindow(JobId job, uint64 index, uint256 until) external;

    /// @notice The trainer is proven to have committed a malformed log: the job becomes Fraudulent,
    ///         `winner` is credited the trainer's stake and the client its payment.
    /// @dev Only the availability contract; the job must be Active.
    /// @param job The job.
    /// @param winner The prover.
    function convict(JobId job, address winner) external;

    /// @notice The availability contract bound to this registry (zero before `setAvailability`).
    function availability() external view returns (address);

    // ------------------------------------------------------------ views

    /// @notice The dispute game bound to this registry (zero before `setDisputeGame`).
    function disputeGame() external view returns (address);

    /// @notice Number of jobs created; ids run from 1 to jobCount().
    function jobCount() external view returns (uint64);

    /// @notice The job's full record (reverts with `UnknownJob`).
    /// @param job The job.
    function getJob(JobId job) external view returns (Job memory);

    /// @notice The job's parameters (reverts with `UnknownJob`).
    /// @param job The job.
    function jobParams(JobId job) external view returns (JobParams memory);

    /// @notice The job's status (None for an unknown id).
    /// @param job The job.
    function jobStatus(JobId job) external view returns (JobStatus);

    /// @notice ceil(nSteps / intervalLength).
    /// @param job The job.
    function nIntervals(JobId job) external view returns (uint64);

    /// @notice Steps of interval `index`: the first step and the number of steps.
    /// @param job The job.
    /// @param index The interval.
    /// @return firstStep The interval's first step (steps are 1-based).
    /// @return size Number of steps in the interval.
    function intervalSpan(JobId job, uint64 index) external view returns (uint64 firstStep, uint64 size);

    /// @notice A posted interval's root, posting time and window start (zeros when not posted).
    /// @param job The job.
    /// @param index The interval.
    function getInterval(JobId job, uint64 index) external view returns (Interval memory);

    /// @notice Last second at which interval `index` can be challenged (0 when not posted): its
    ///         `unextendedWindowEnd`, or later once `extendWindow` moved it.
    /// @param job The job.
    /// @param index The interval.
    function windowEnd(JobId job, uint64 index) external view returns (uint256);

    /// @notice Last second of interval `index`'s challenge window before any extension (0 when not
    ///         posted): windowStart + challengeWindow, where windowStart = max(postedAt, previous
    ///         interval's windowStart + postingPeriod) (interval 0: postedAt). The window never
    ///         closes before it would have had the interval been posted on the terms' schedule
    ///         (windowStart >= acceptedAt + index * postingPeriod), however early it was posted, and
    ///         overdue intervals posted together close one posting period apart. Availability
    ///         demands are accepted until then.
    /// @param job The job.
    /// @param index The interval.
    function unextendedWindowEnd(JobId job, uint64 index) external view returns (uint256);

    /// @notice Last second at which interval `index` may be posted before the client can reclaim the
    ///         job: acceptedAt + (index + 1) * postingPeriod (0 before acceptance).
    /// @param job The job.
    /// @param index The interval.
    function postingDeadline(JobId job, uint64 index) external view returns (uint256);

    /// @notice Last second at which the trainer may accept the job and before which its client
    ///         cannot cancel it: createdAt + acceptPeriod (reverts with `UnknownJob`).
    /// @param job The job.
    function acceptDeadline(JobId job) external view returns (uint256);

    /// @notice Wei held for the job (see the solvency invariant).
    /// @param job The job.
    function escrowOf(JobId job) external view returns (uint256);

    /// @notice Wei credited to `account` and not yet withdrawn.
    /// @param account The account.
    function owed(address account) external view returns (uint256);

    /// @notice Sum of `owed` over all accounts.
    function totalOwed() external view returns (uint256);

    /// @notice Wei of convicted stakes burned: held by the registry for good, never credited.
    function totalBurned() external view returns (uint256);

    /// @notice Least challengeWindow (seconds) a job may have (a deployment parameter).
    function minChallengeWindow() external view returns (uint64);

    /// @notice Least clock (seconds per party per game) a job may have (a deployment parameter).
    function minClock() external view returns (uint64);

    /// @notice Least postingPeriod (seconds per interval) a job may have (a deployment parameter).
    function minPostingPeriod() external view returns (uint64);

    /// @notice Least challengerBond (wei) a job may have (a deployment parameter).
    function minChallengerBond() external view returns (uint128);

    /// @notice Part of a convicted stake paid to the winner, in basis points (1..9999; a deployment
    ///         parameter); the rest is burned.
    function bountyBps() external view returns (uint16);
}
