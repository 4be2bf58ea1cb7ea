// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @notice One party's chess clock, packed in 128 bits:
///
///         | bits     | field       | meaning                                                  |
///         |----------|-------------|----------------------------------------------------------|
///         | [127:64] | `duration`  | seconds left on the clock, as of `startedAt`             |
///         | [63:0]   | `startedAt` | unix time the clock started running; 0 while it is stopped |
///
///         Only the side to move has a running clock. It may still move at `deadline()` =
///         `startedAt + duration` (the last second is valid) and has run out from `deadline() + 1`.
type Clock is uint128;

using LibClock for Clock global;

/// @title LibClock
/// @notice Pure helpers of the `Clock` value type.
library LibClock {
    /// @notice Thrown when a move is made on a clock that has run out.
    /// @param deadline Last second at which the move was valid.
    /// @param now_ Block time of the attempted move.
    error ClockExpired(uint256 deadline, uint256 now_);

    /// @notice A clock with `duration_` seconds left that started running at `startedAt_` (0: stopped).
    function wrap(uint64 duration_, uint64 startedAt_) internal pure returns (Clock) {
        return Clock.wrap((uint128(duration_) << 64) | uint128(startedAt_));
    }

    /// @notice Seconds left on the clock as of `startedAt` (the whole remainder while stopped).
    function duration(Clock c) internal pure returns (uint64) {
        return uint64(Clock.unwrap(c) >> 64);
    }

    /// @notice Unix time the clock started running, 0 while stopped.
    function startedAt(Clock c) internal pure returns (uint64) {
        return uint64(Clock.unwrap(c));
    }

    /// @notice True while the clock is running.
    function running(Clock c) internal pure returns (bool) {
        return startedAt(c) != 0;
    }

    /// @notice Last second at which the owner of a running clock may move.
    function deadline(Clock c) internal pure returns (uint256) {
        return uint256(startedAt(c)) + uint256(duration(c));
    }

    /// @notice True when the clock is running and its owner can no longer move at time `now_`.
    function expired(Clock c, uint256 now_) internal pure returns (bool) {
        return running(c) && now_ > deadline(c);
    }

    /// @notice Seconds the owner still has at time `now_` (0 once expired).
    function remaining(Clock c, uint256 now_) internal pure returns (uint64) {
        if (!running(c)) return duration(c);
        if (now_ >= deadline(c)) return 0;
        return uint64(deadline(c) - now_);
    }

    /// @notice The clock started at `now_` (a no-op on the duration).
    function start(Clock c, uint256 now_) internal pure returns (Clock) {
        return wrap(duration(c), uint64(now_));
    }

    /// @notice The clock stopped at `now_`: the elapsed time is charged to it.
    /// @dev Reverts with `ClockExpired` when the move comes after the deadline.
    function stop(Clock c, uint256 now_) internal pure returns (Clock) {
        if (!running(c)) return c;
        // SAFETY: a move after the deadline would underflow the duration; it is a timeout instead.
        if (now_ > deadline(c)) revert ClockExpired(deadline(c), now_);
        return wrap(uint64(deadline(c) - now_), 0);
    }
}
