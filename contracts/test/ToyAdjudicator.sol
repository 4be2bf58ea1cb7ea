// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IAdjudicator} from "contracts/interfaces/IAdjudicator.sol";

/// @title ToyAdjudicator
/// @notice Test stand-in for the one-step adjudicator: the test registers the true FP32 bits of
///         an element under the hash of its whole context (`keyOf`), and `adjudicate` compares
///         the claim with it. A claim the test never registered reverts, so a game that passes a
///         wrong context (index, step, op log root, inputs, ...) fails the test.
contract ToyAdjudicator is IAdjudicator {
    /// @notice Thrown when the proof starts with 0xff (the test's "malformed proof").
    error ToyRejectedProof(bytes proof);
    /// @notice Thrown when no truth was registered for the claim's context.
    error ToyUnknownClaim(bytes32 key);

    /// @notice Emitted when the test registers a truth.
    event TruthSet(bytes32 indexed key, uint32 value);

    /// @notice key => true value + 1 (0: unknown).
    mapping(bytes32 key => uint64 valuePlusOne) public truth;

    /// @notice Registers the true bits of the element with context `key`.
    function setTruth(bytes32 key, uint32 value) external {
        truth[key] = uint64(value) + 1;
        emit TruthSet(key, value);
    }

    /// @notice The context key of a claim: everything but the claimed value.
    function keyOf(ElementClaim calldata c) public pure returns (bytes32) {
        return keccak256(
            abi.encode(c.descriptor, c.inputRoots, c.index, c.opLogRoot, c.step, c.dataRoot, c.dataSeed, c.nSamples)
        );
    }

    /// @inheritdoc IAdjudicator
    function adjudicate(ElementClaim calldata claim, bytes calldata proof) external view returns (bool) {
        if (proof.length > 0 && proof[0] == 0xff) revert ToyRejectedProof(proof);
        bytes32 key = keyOf(claim);
        uint64 t = truth[key];
        if (t == 0) revert ToyUnknownClaim(key);
        return claim.claimed == uint32(t - 1);
    }
}
