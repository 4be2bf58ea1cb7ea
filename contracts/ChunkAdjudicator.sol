// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IAdjudicator} from "contracts/interfaces/IAdjudicator.sol";
import {IChunkAdjudicator} from "contracts/interfaces/IChunkAdjudicator.sol";
import {ChunkedSum} from "contracts/lib/ChunkedSum.sol";
import {ExactSum} from "contracts/lib/ExactSum.sol";
import {Partial} from "contracts/lib/GameTypes.sol";
import {LogLeaf} from "contracts/lib/LogLeaf.sol";
import {OpKinds} from "contracts/lib/OpKinds.sol";
import {RoundingRule} from "contracts/lib/RoundingRule.sol";
import {TensorIndex} from "contracts/lib/TensorIndex.sol";
import {TensorProof} from "contracts/lib/TensorProof.sol";

/// @title ChunkAdjudicator
/// @notice Rulings of the chunk level (IChunkAdjudicator): one chunk of a long MATMUL/SUM/MEAN
///         element recomputed from opened input rows, and the element ruled from its partials.
///         Deployed by DisputeGame's constructor; kept apart from Adjudicator so that neither
///         contract nears the EIP-170 size limit.
/// @dev Term `t` of element `index`: MATMUL `a[row, t] * b[batch, j, t]` for `t < K` and `bias[j]`
///      for `t = K`; SUM/MEAN `a[index, t]` (the shape rules of TensorIndex `matmulDims`/`reducedLength`,
///      as Adjudicator `_matmul`/`_reduce`).
contract ChunkAdjudicator is IChunkAdjudicator {
    /// @notice One range opening of tensor chunks (as Adjudicator.Opening).
    struct Opening {
        bytes data;
        bytes32[] siblings;
    }

    /// @dev Where the terms of one element are.
    struct Layout {
        uint8 kind;
        uint256 n; // terms
        uint256 k; // terms read from rows (MATMUL: K; SUM/MEAN: n)
        bool bias;
        uint256 aStart; // flat index of the element's first term in input 0
        uint256 bStart; // MATMUL: flat index of b[batch, j, 0]
        uint256 j; // MATMUL: output column (bias index)
        uint32[][] inShapes;
    }

    /// @notice Thrown when the descriptor is not a well-formed MATMUL/SUM/MEAN or the claim does not fit it.
    error NotChunkable(uint8 kind);
    /// @notice Thrown when the proof carries fewer or more openings than the chunk reads.
    error OpeningCount(uint256 supplied, uint256 needed);

    /// @inheritdoc IChunkAdjudicator
    function terms(bytes calldata descriptor) external pure returns (uint256 n) {
        (bool ok, Layout memory l) = _layout(descriptor, 0, type(uint256).max);
        return ok ? l.n : 0;
    }

    /// @inheritdoc IChunkAdjudicator
    function checkChunk(
        IAdjudicator.ElementClaim calldata claim,
        Partial[] calldata partials,
        uint256 chunk,
        bytes calldata proof
    ) external view returns (bool trainerRight) {
        Layout memory l = _claimLayout(claim);
        Partial[] memory p = partials;
        ChunkedSum.check(p, l.n);
        if (chunk >= p.length) revert ChunkedSum.ChunkCount(chunk, p.length);
        Opening[] memory o = abi.decode(proof, (Opening[]));
        uint256 lo = chunk * ChunkedSum.CHUNK_TERMS;
        uint256 hi = lo + ChunkedSum.chunkTerms(l.n, chunk);
        uint256[] memory ts = new uint256[](hi - lo);
        uint256 next;
        uint256 rowEnd = hi < l.k ? hi : l.k;
        if (lo < rowEnd) {
            uint256 count = rowEnd - lo;
            (bytes memory aData, uint256 aOff) = _readRow(claim.inputRoots[0], l.inShapes[0], l.aStart + lo, count, o, next++);
            bytes memory bData;
            uint256 bOff;
            if (l.kind == OpKinds.MATMUL) {
                (bData, bOff) = _readRow(claim.inputRoots[1], l.inShapes[1], l.bStart + lo, count, o, next++);
            }
            ExactSum.fill(aData, aOff, bData, bOff, ts, count);
        }
        if (l.bias && hi == l.n) {
            (bytes memory d, uint256 off) = _readRow(claim.inputRoots[2], l.inShapes[2], l.j, 1, o, next++);
            ts[hi - lo - 1] = ExactSum.value(TensorProof.f32At(d, off));
        }
        // INVARIANT: every supplied opening was read, so a proof has one canonical form.
        if (next != o.length) revert OpeningCount(o.length, next);
        Partial memory mine = ChunkedSum.partialAt(ts, ChunkedSum.scale(p));
        Partial memory theirs = p[chunk];
        return mine.maxExp == theirs.maxExp && mine.sum == theirs.sum && mine.absSum == theirs.absSum
            && mine.inexact == theirs.inexact && mine.tail[0] == theirs.tail[0] && mine.tail[1] == theirs.tail[1]
            && mine.tail[2] == theirs.tail[2] && mine.tail[3] == theirs.tail[3];
    }

    /// @inheritdoc IChunkAdjudicator
    function ruleFromPartials(
        IAdjudicator.ElementClaim calldata claim,
        Partial[] calldata partials,
        bytes calldata proof
    ) external view returns (bool trainerRight) {
        Layout memory l = _claimLayout(claim);
        Partial[] memory p = partials;
        ChunkedSum.check(p, l.n);
        LogLeaf.Opening memory lg = abi.decode(proof, (LogLeaf.Opening));
        (uint8 code, uint32 value) = LogLeaf.entry(claim.opLogRoot, claim.index, lg);
        ExactSum.Accumulation memory acc = ChunkedSum.total(p);
        RoundingRule.Enclosure memory x =
            l.kind == OpKinds.MEAN ? ExactSum.meanEnclosure(acc, l.n) : ExactSum.sumEnclosure(acc, l.n);
        (uint32 rLo, uint32 rHi) = RoundingRule.ends(x);
        // INVARIANT: only RN32(e) stands: where [lo, hi] holds an FP32 midpoint, the partials' exact
        // tails decide (as Adjudicator's second pass over the terms).
        if (rLo != rHi) {
            rLo = ExactSum.roundOf(acc.sum, ChunkedSum.tailTotal(p), acc.lsbExp, l.kind == OpKinds.MEAN ? l.n : 1);
            rHi = rLo;
        }
        return RoundingRule.judgeEnds(x, rLo, rHi, claim.claimed, code, value);
    }

    // ---------------------------------------------------------------------------------------------

    function _claimLayout(IAdjudicator.ElementClaim calldata claim) private pure returns (Layout memory l) {
        bool ok;
        (ok, l) = _layout(claim.descriptor, claim.index, claim.inputRoots.length);
        if (!ok) revert NotChunkable(l.kind);
    }

    /// @dev The terms' layout of element `index`; `ok` false for other kinds, malformed shapes, an
    ///      index outside the output, or `nRoots` (max: not checked) not one per input.
    function _layout(bytes calldata descriptor, uint256 index, uint256 nRoots)
        private
        pure
        returns (bool ok, Layout memory l)
    {
        uint32[] memory inputs;
        uint32[] memory shape;
        (l.kind, inputs, shape, l.inShapes,) = abi.decode(descriptor, (uint8, uint32[], uint32[], uint32[][], uint256[]));
        uint8 kind = l.kind;
        if (kind != OpKinds.MATMUL && kind != OpKinds.SUM && kind != OpKinds.MEAN) return (false, l);
        uint256 nIn = inputs.length;
        if (l.inShapes.length != nIn || (nRoots != type(uint256).max && nRoots != nIn)) return (false, l);
        if (shape.length == 0 || shape.length > TensorIndex.MAX_RANK) return (false, l);
        if (nRoots != type(uint256).max && index >= TensorIndex.numel(shape)) return (false, l);
        if (kind != OpKinds.MATMUL) {
            if (nIn != 1) return (false, l);
            l.n = TensorIndex.reducedLength(shape, l.inShapes[0]);
            if (l.n == 0) return (false, l);
            l.k = l.n;
            l.aStart = index * l.n;
            return (true, l);
        }
        if (nIn != 2 && nIn != 3) return (false, l);
        l.bias = nIn == 3;
        (uint256 bad, uint256 m, uint256 nOut, uint256 kk) = TensorIndex.matmulDims(shape, l.inShapes);
        if (bad != type(uint256).max) return (false, l);
        l.j = index % nOut;
        uint256 row = index / nOut;
        l.k = kk;
        l.n = l.bias ? kk + 1 : kk;
        l.aStart = row * kk;
        l.bStart = ((row / m) * nOut + l.j) * kk;
        return (true, l);
    }

    /// @dev Verifies opening `at` as the chunks of elements [start, start + len) of a tensor; returns
    ///      the opened bytes and the position of element `start` in them.
    function _readRow(
        bytes32 root,
        uint32[] memory shape,
        uint256 start,
        uint256 len,
        Opening[] memory o,
        uint256 at
    ) private view returns (bytes memory, uint256) {
        if (at >= o.length) revert OpeningCount(o.length, at + 1);
        uint256 base = TensorProof.verifyElements(root, TensorIndex.numel(shape), start, len, o[at].data, o[at].siblings);
        return (o[at].data, start - base);
    }
}
