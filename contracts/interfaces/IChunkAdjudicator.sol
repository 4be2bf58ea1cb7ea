// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IAdjudicator} from "contracts/interfaces/IAdjudicator.sol";
import {Partial} from "contracts/lib/GameTypes.sol";

/// @title IChunkAdjudicator
/// @notice The chunk level of a long reduction (MATMUL, SUM, MEAN of more than
///         `ChunkedSum.MAX_DIRECT_TERMS` terms; docs/protocol.md, "Chunk level"): the trainer's
///         per-chunk partial sums are checked one chunk at a time, and the element is ruled from them.
interface IChunkAdjudicator {
    /// @notice Number of terms of the reduction an element of this op sums (MATMUL: K, +1 with a
    ///         bias; SUM/MEAN: the reduced length); 0 for other kinds and for malformed descriptors.
    /// @param descriptor The op descriptor (graph leaf encoding).
    /// @return n The term count.
    function terms(bytes calldata descriptor) external pure returns (uint256 n);

    /// @notice Recomputes chunk `chunk` of the element from Merkle-opened input rows at the scale of
    ///         the posted partials; true when it equals the posted partial of that chunk (every
    ///         field, the exact tail included).
    /// @param claim The element and its proven context (as for `IAdjudicator.adjudicate`).
    /// @param partials The posted partials (one per chunk).
    /// @param chunk The disputed chunk.
    /// @param proof `abi.encode(Opening[])`: the chunks of a's row segment and b's (MATMUL), or of
    ///        the reduced row's segment (SUM/MEAN), then bias[j] when the chunk holds the bias term.
    /// @return trainerRight True when the posted partial is right.
    function checkChunk(
        IAdjudicator.ElementClaim calldata claim,
        Partial[] calldata partials,
        uint256 chunk,
        bytes calldata proof
    ) external view returns (bool trainerRight);

    /// @notice Rules on the claimed element from the (accepted) partials, with the rounding rule and
    ///         the committed log entry: the one-step ruling with the sum (and, where its enclosure
    ///         holds an FP32 midpoint, the exact tail) taken from the partials.
    /// @param claim The element and its proven context.
    /// @param partials The posted partials.
    /// @param proof `abi.encode(LogOpening)`: the two log leaves around the element's key.
    /// @return trainerRight True when the claimed value stands.
    function ruleFromPartials(
        IAdjudicator.ElementClaim calldata claim,
        Partial[] calldata partials,
        bytes calldata proof
    ) external view returns (bool trainerRight);
}
