// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {Merkle} from "contracts/lib/Merkle.sol";

/// @title SmokeCounter
/// @notice Toolchain smoke test, not part of the protocol: a counter whose update also hashes a
///         2-leaf tree through the shared Merkle library, so a repo-root import, deployment,
///         a state-changing call, an event and a view call are exercised on every chain.
contract SmokeCounter {
    /// @notice Number of `increment` calls so far.
    uint256 public count;
    /// @notice Root of the pair passed to the last `increment`.
    bytes32 public lastRoot;

    /// @notice Emitted on every `increment`.
    event Incremented(uint256 count, bytes32 root);

    /// @notice Bumps the counter and stores the 2-leaf Merkle root of (a, b).
    function increment(bytes32 a, bytes32 b) external returns (uint256) {
        bytes32 root = pairRoot(a, b);
        lastRoot = root;
        count += 1;
        emit Incremented(count, root);
        return count;
    }

    /// @notice RFC 9162 root of the 2-leaf tree with leaf data a, b (32 bytes each).
    function pairRoot(bytes32 a, bytes32 b) public pure returns (bytes32) {
        bytes32[] memory values = new bytes32[](2);
        values[0] = a;
        values[1] = b;
        return Merkle.rootOf(values);
    }
}
