// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title IAdjudicator
/// @notice The one-step check at the bottom of a dispute game. The game proves everything at the
///         tree level (descriptor against the graph root, input records against the agreed trace,
///         the claimed element against the op's output root, the op log root against logRoot_s);
///         the adjudicator checks the single element against its inputs and its log entry.
interface IAdjudicator {
    /// @notice One disputed output element and its already-proven context.
    /// @param descriptor The op descriptor: abi.encode(uint8 kind, uint32[] inputs, uint32[] shape,
    ///        uint32[][] inShapes, uint256[] attrs), proven against the job's graph root.
    /// @param inputRoots Output tensor roots of the op's inputs, in descriptor order (agreed).
    /// @param index Flat row-major index of the disputed output element.
    /// @param claimed FP32 bits the trainer committed for that element.
    /// @param opLogRoot The op's rounding-log root, proven against logRoot_s.
    /// @param step The step s whose trace is disputed (DATA ops need it).
    /// @param dataRoot Dataset root of the job (DATA ops).
    /// @param dataSeed Data-order seed of the job (DATA ops).
    /// @param nSamples Number of samples under dataRoot (DATA ops).
    struct ElementClaim {
        bytes descriptor;
        bytes32[] inputRoots;
        uint256 index;
        uint32 claimed;
        bytes32 opLogRoot;
        uint64 step;
        bytes32 dataRoot;
        bytes32 dataSeed;
        uint64 nSamples;
    }

    /// @notice Rules on one element: true when the claimed value is what the op's exact semantics,
    ///         the certified bound and the committed log entry allow.
    /// @dev Reverts (custom errors) on a malformed or non-verifying proof, so a party can retry
    ///      with a correct one; returns false only for a well-proven wrong claim.
    /// @param claim The element and its proven context.
    /// @param proof abi-encoded openings of the input elements and of the log entry (see Adjudicator).
    /// @return trainerRight True when the trainer's claimed value stands.
    function adjudicate(ElementClaim calldata claim, bytes calldata proof) external view returns (bool trainerRight);
}
