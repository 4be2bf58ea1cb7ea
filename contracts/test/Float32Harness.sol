// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {ExactSum} from "contracts/lib/ExactSum.sol";
import {Float32} from "contracts/lib/Float32.sol";
import {RoundingRule} from "contracts/lib/RoundingRule.sol";

/// @title Float32Harness
/// @notice Test-only: exposes the internal float libraries (tests/test_float32.py).
contract Float32Harness {
    /// @notice Float32.round (saturating RN32 of a signed rational).
    function round(bool neg, uint256 num, int256 exp, uint256 den) external pure returns (uint32) {
        return Float32.round(neg, num, exp, den);
    }

    /// @notice Float32.round on many values at once (one call per batch keeps tests fast).
    function roundMany(bool[] calldata neg, uint256[] calldata num, int256[] calldata exp, uint256[] calldata den)
        external
        pure
        returns (uint32[] memory out)
    {
        out = new uint32[](num.length);
        for (uint256 i = 0; i < num.length; ++i) {
            out[i] = Float32.round(neg[i], num[i], exp[i], den[i]);
        }
    }

    /// @notice Float32.roundStrict (reverts Overflow).
    function roundStrict(bool neg, uint256 num, int256 exp, uint256 den) external pure returns (uint32) {
        return Float32.roundStrict(neg, num, exp, den);
    }

    /// @notice Float32.fromFloat64 on many binary64 patterns.
    function fromFloat64Many(uint64[] calldata bits) external pure returns (uint32[] memory out) {
        out = new uint32[](bits.length);
        for (uint256 i = 0; i < bits.length; ++i) {
            out[i] = Float32.fromFloat64(bits[i]);
        }
    }

    /// @notice Float32.midpoint.
    function midpoint(uint32 c, bool above) external pure returns (int256, int256, uint256, int256) {
        return Float32.midpoint(c, above);
    }

    /// @notice Float32.compare.
    function compare(int256 a, int256 aExp, uint256 aDen, int256 b, int256 bExp) external pure returns (int256) {
        return Float32.compare(a, aExp, aDen, b, bExp);
    }

    /// @notice Float32.isqrt.
    function isqrt(uint256 a) external pure returns (uint256) {
        return Float32.isqrt(a);
    }

    /// @notice ExactSum over values (`products == false`) or pairs `a0, b0, a1, b1, ...`.
    function accumulate(uint32[] calldata xs, bool products)
        external
        pure
        returns (int256 sum, uint256 absSum, uint256 inexact, int256 lsbExp)
    {
        uint256 n = products ? xs.length / 2 : xs.length;
        uint256[] memory terms = new uint256[](n);
        for (uint256 i = 0; i < n; ++i) {
            terms[i] = products ? ExactSum.product(xs[2 * i], xs[2 * i + 1]) : ExactSum.value(xs[i]);
        }
        ExactSum.Accumulation memory acc = ExactSum.accumulate(terms);
        return (acc.sum, acc.absSum, acc.inexact, acc.lsbExp);
    }

    /// @notice ExactSum.roundExact over values or pairs (as `accumulate`), with the exact tail
    ///         (ExactSum.tailAt) at the terms' scale.
    function roundExact(uint32[] calldata xs, bool products, uint256 den)
        external
        pure
        returns (uint32 rounded, int256[4] memory tail)
    {
        uint256 n = products ? xs.length / 2 : xs.length;
        uint256[] memory terms = new uint256[](n);
        for (uint256 i = 0; i < n; ++i) {
            terms[i] = products ? ExactSum.product(xs[2 * i], xs[2 * i + 1]) : ExactSum.value(xs[i]);
        }
        rounded = ExactSum.roundExact(terms, den);
        uint256 top = ExactSum.maxEst(terms);
        if (top != 0) tail = ExactSum.tailAt(terms, top);
    }

    /// @notice ExactSum.fill over LE byte strings, next to the packing of `product` for the same pairs.
    function fillTerms(bytes calldata a, bytes calldata b, uint256 count)
        external
        pure
        returns (uint256[] memory filled, uint256[] memory packed)
    {
        filled = new uint256[](count);
        ExactSum.fill(a, 0, b, 0, filled, count);
        packed = new uint256[](count);
        for (uint256 i = 0; i < count; ++i) {
            uint32 x = _le(a, i);
            packed[i] = b.length == 0 ? ExactSum.value(x) : ExactSum.product(x, _le(b, i));
        }
    }

    function _le(bytes calldata d, uint256 i) private pure returns (uint32) {
        return uint32(uint8(d[4 * i])) | (uint32(uint8(d[4 * i + 1])) << 8) | (uint32(uint8(d[4 * i + 2])) << 16)
            | (uint32(uint8(d[4 * i + 3])) << 24);
    }

    /// @notice RoundingRule.judge on an explicit enclosure.
    function judge(RoundingRule.Enclosure calldata x, uint32 claimed, uint8 code, uint32 value)
        external
        pure
        returns (bool)
    {
        return RoundingRule.judge(x, claimed, code, value);
    }
}
