// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

import {IAdjudicator} from "contracts/interfaces/IAdjudicator.sol";
import {ExactSum} from "contracts/lib/ExactSum.sol";
import {Float32} from "contracts/lib/Float32.sol";
import {LogLeaf} from "contracts/lib/LogLeaf.sol";
import {OpKinds} from "contracts/lib/OpKinds.sol";
import {RoundingRule} from "contracts/lib/RoundingRule.sol";
import {TensorIndex} from "contracts/lib/TensorIndex.sol";
import {TensorProof} from "contracts/lib/TensorProof.sol";
import {Transcendental} from "contracts/Transcendental.sol";

/// @title Adjudicator
/// @notice The one-step check: recomputes one output element of one op from Merkle-opened inputs,
///         exactly (or in a tight enclosure, see ExactSum), and applies the rounding rule of
///         docs/numerics.md to the claimed value and the committed log entry (RoundingRule).
///         Supported kinds: ADD SUB MUL DIV ADD_S MUL_S DIV_S RSUB_S SQRT MATMUL SUM MEAN MAX RELU
///         RELU_GRAD OUTPUT RESHAPE PERMUTE SLICE PAD EXPAND ONE_HOT GATHER TAKE SELECT MAX_GRAD
///         DROPOUT_MASK STEP CONCAT DATA EXP LOG TANH ERF (the last four enclosed by the `Transcendental`
///         contract this one deploys). The bind ops
///         INPUT CONST (ruled by the game) and unknown codes revert with `UnsupportedOp`.
///
///         One-step proof encoding (also docs/protocol.md, "One-step proof encoding"):
///         `proof = abi.encode(Opening[] openings, LogOpening log)` with
///         `Opening = (bytes data, bytes32[] siblings)` and
///         `LogOpening = (uint256 position, uint256 size, bytes leaves, bytes32[] siblings)` (LogLeaf.Opening).
///         - An `Opening` is a TensorProof range opening whose position the contract derives: the
///           FP32 LE bytes of the whole 64-element chunks that hold the elements read (one element,
///           or a whole contiguous row for MATMUL/SUM/MEAN/MAX), against the input's tensor root;
///           for DATA the sample's bytes (one leaf) against `dataRoot` at the sampled index.
///         - `openings` lists the reads in the order the op makes them, and only those it makes:
///           elementwise ops: input 0 then input 1; MATMUL: row of a, row of b, then the chunk of
///           bias[j]; GATHER and TAKE: idx, then x only when idx is a valid index; RELU_GRAD: x,
///           then g only when x > 0; SELECT: cond, then a (cond != 0) or b; MAX_GRAD: the row of x,
///           then g only at the row's first maximum; PAD: nothing when the element is padding;
///           CONCAT: the one input holding the element;
///           ONE_HOT: idx; DATA: the sample; DROPOUT_MASK, STEP: nothing.
///         - `log` opens the adjacent log leaves `position, position + 1` (9 bytes each) with
///           `key_p < index + 1 <= key_{p+1}`: the entry is leaf p+1 when its key is `index + 1`,
///           otherwise the element has no entry (code none).
/// @dev Reverts (custom errors) on malformed descriptors, non-verifying openings and non-finite
///      inputs; returns false for a well-proven claim that the rule rejects, including claims on
///      elements with no finite value (division by zero, square root of a negative number).
contract Adjudicator is IAdjudicator {
    /// @notice One range opening of tensor chunks or of a dataset sample (positions are derived).
    struct Opening {
        bytes data;
        bytes32[] siblings;
    }

    /// @dev What one ruling works on.
    struct Ctx {
        uint8 kind;
        uint256 index;
        uint32[] shape;
        uint32[][] inShapes;
        uint256[] attrs;
        bytes32[] roots;
        Opening[] openings;
        uint256 next;
        // MATMUL/SUM/MEAN, for the exact second pass: the packed terms, their first pass's sum and quantum.
        uint256[] terms;
        int256 sum;
        int256 lsbExp;
    }

    /// @notice Thrown for op kinds this adjudicator does not rule on (bind ops, unknown codes).
    error UnsupportedOp(uint8 kind);
    /// @notice Thrown when the number of input roots or input shapes does not fit the op.
    error InputCount(uint8 kind, uint256 actual, uint256 expected);
    /// @notice Thrown when an input's shape does not fit the op and its output shape.
    error ShapeMismatch(uint8 kind, uint256 input);
    /// @notice Thrown when an op's attributes are missing or out of range.
    error BadAttrs(uint8 kind, uint256 position);
    /// @notice Thrown when the proof carries fewer or more input openings than the element reads.
    error OpeningCount(uint256 supplied, uint256 needed);
    /// @notice Thrown when the output index is outside the output tensor (LogLeaf: beyond the log's key space).
    error IndexOutOfRange(uint256 index, uint256 limit);
    /// @notice Thrown when a DATA op is ruled for a job without samples.
    error NoSamples();
    /// @notice Thrown when a MAX / MAX_GRAD row or a DATA sample is longer than one ruling can read
    ///         within the transaction gas cap (protocol/rulability.py refuses such jobs up front).
    error RowTooLong(uint8 kind, uint256 length, uint256 limit);

    /// @notice Longest MAX / MAX_GRAD row one ruling reads (about 570 gas an element: 9.3M gas at the
    ///         limit, under the 16,777,216 cap with the game's own overhead).
    uint256 public constant MAX_ROW = 16_384;
    /// @notice Longest DATA sample one ruling opens (about 160 gas an element: ~10.6M gas at the limit).
    uint256 public constant MAX_SAMPLE = 65_536;

    /// @notice The enclosures of EXP LOG TANH ERF (a separate contract keeps this one under EIP-170).
    Transcendental public immutable transcendental;

    /// @notice Deploys the `Transcendental` contract this adjudicator calls for EXP LOG TANH ERF.
    constructor() {
        transcendental = new Transcendental();
    }

    /// @inheritdoc IAdjudicator
    function adjudicate(ElementClaim calldata claim, bytes calldata proof) external view returns (bool trainerRight) {
        Ctx memory c;
        uint32[] memory inputs;
        (c.kind, inputs, c.shape, c.inShapes, c.attrs) =
            abi.decode(claim.descriptor, (uint8, uint32[], uint32[], uint32[][], uint256[]));
        LogLeaf.Opening memory logOpening;
        (c.openings, logOpening) = abi.decode(proof, (Opening[], LogLeaf.Opening));
        c.index = claim.index;
        c.roots = claim.inputRoots;
        // INVARIANT: one agreed root and one shape per descriptor input.
        if (inputs.length != c.roots.length || c.inShapes.length != c.roots.length) {
            revert InputCount(c.kind, c.roots.length, inputs.length);
        }
        uint256 n = TensorIndex.numel(c.shape);
        if (c.index >= n) revert IndexOutOfRange(c.index, n);
        (uint8 code, uint32 value) = LogLeaf.entry(claim.opLogRoot, c.index, logOpening);

        (RoundingRule.Enclosure memory x, bool defined) = _exactValue(c, claim);
        // INVARIANT: every supplied opening was read, so a proof has one canonical form.
        if (c.next != c.openings.length) revert OpeningCount(c.openings.length, c.next);
        if (!defined) return false;
        (uint32 rLo, uint32 rHi) = RoundingRule.ends(x);
        // INVARIANT: only RN32(e) stands. Where the first pass leaves an FP32 midpoint inside [lo, hi]
        // (a sum whose terms span more than ~2^72), the exact second pass decides.
        if (rLo != rHi && c.terms.length != 0) {
            // SAFETY: the ends differ only when a term was floored, so a term is non-zero and top >= 1.
            int256 top = c.lsbExp + ExactSum.LSB_OFFSET;
            uint256 den = c.kind == OpKinds.MEAN ? c.terms.length : 1;
            rLo = ExactSum.roundOf(c.sum, ExactSum.tailAt(c.terms, uint256(top)), c.lsbExp, den);
            rHi = rLo;
        }
        return RoundingRule.judgeEnds(x, rLo, rHi, claim.claimed, code, value);
    }

    // ---------------------------------------------------------------------------------------------
    // Per-kind exact semantics (docs/protocol.md, "Op kinds")
    // ---------------------------------------------------------------------------------------------

    /// @dev The enclosure of the element's exact value; `defined` is false when it has no finite value.
    function _exactValue(Ctx memory c, ElementClaim calldata claim)
        private
        view
        returns (RoundingRule.Enclosure memory x, bool defined)
    {
        uint8 k = c.kind;
        defined = true;
        if (k == OpKinds.ADD || k == OpKinds.SUB || k == OpKinds.MUL || k == OpKinds.DIV || k == OpKinds.RELU_GRAD)
        {
            return _binary(c);
        }
        if (k >= OpKinds.ADD_S && k <= OpKinds.RSUB_S) return _scalar(c);
        if (k == OpKinds.SQRT) {
            _inputs(c, 1);
            _sameShape(c, 0);
            return _sqrt(_read(c, 0, c.index));
        }
        if (k == OpKinds.MATMUL) return (_matmul(c), true);
        if (k == OpKinds.SUM || k == OpKinds.MEAN || k == OpKinds.MAX) return (_reduce(c), true);
        if (k == OpKinds.DATA) return (_data(c, claim), true);
        if (k == OpKinds.ONE_HOT) return (_oneHot(c), true);
        if (k == OpKinds.GATHER) return (_gather(c), true);
        if (k == OpKinds.TAKE) return (_take(c), true);
        if (k == OpKinds.SELECT) return (_select(c), true);
        if (k == OpKinds.MAX_GRAD) return (_maxGrad(c), true);
        if (k == OpKinds.DROPOUT_MASK) return (_dropoutMask(c, claim), true);
        if (k == OpKinds.STEP) return (_step(c, claim), true);
        if (k == OpKinds.RELU) {
            _inputs(c, 1);
            _sameShape(c, 0);
            uint32 a = _read(c, 0, c.index);
            return (RoundingRule.exactly(_positive(a) ? a : 0), true);
        }
        if (k == OpKinds.OUTPUT || (k >= OpKinds.RESHAPE && k <= OpKinds.EXPAND)) return (_move(c), true);
        if (k == OpKinds.CONCAT) return (_concat(c), true);
        if (k == OpKinds.EXP || k == OpKinds.LOG || k == OpKinds.TANH || k == OpKinds.ERF) {
            _inputs(c, 1);
            _sameShape(c, 0);
            return transcendental.enclose(k, _read(c, 0, c.index));
        }
        revert UnsupportedOp(k);
    }

    /// @dev ADD SUB MUL DIV RELU_GRAD with broadcasting.
    function _binary(Ctx memory c) private view returns (RoundingRule.Enclosure memory, bool) {
        _inputs(c, 2);
        uint256[] memory idx = TensorIndex.unravel(c.index, c.shape);
        for (uint256 i = 0; i < 2; ++i) {
            if (!TensorIndex.broadcastsTo(c.inShapes[i], c.shape)) revert ShapeMismatch(c.kind, i);
        }
        uint32 a = _read(c, 0, TensorIndex.ravelBroadcast(idx, c.inShapes[0]));
        if (c.kind == OpKinds.RELU_GRAD) {
            if (!_positive(a)) return (RoundingRule.exactly(0), true);
            return (RoundingRule.exactly(_read(c, 1, TensorIndex.ravelBroadcast(idx, c.inShapes[1]))), true);
        }
        uint32 b = _read(c, 1, TensorIndex.ravelBroadcast(idx, c.inShapes[1]));
        return _arith(c.kind, a, b);
    }

    /// @dev ADD_S MUL_S DIV_S RSUB_S: `a op c` with the FP32 constant `attrs[0]`.
    function _scalar(Ctx memory c) private view returns (RoundingRule.Enclosure memory, bool) {
        _inputs(c, 1);
        _sameShape(c, 0);
        if (c.attrs.length != 1 || c.attrs[0] > type(uint32).max) revert BadAttrs(c.kind, 0);
        uint32 s = uint32(c.attrs[0]);
        if (!Float32.isFinite(s)) revert BadAttrs(c.kind, 0);
        uint32 a = _read(c, 0, c.index);
        if (c.kind == OpKinds.ADD_S) return _arith(OpKinds.ADD, a, s);
        if (c.kind == OpKinds.MUL_S) return _arith(OpKinds.MUL, a, s);
        if (c.kind == OpKinds.DIV_S) return _arith(OpKinds.DIV, a, s);
        return _arith(OpKinds.SUB, s, a);
    }

    /// @dev The exact value of one IEEE op on finite FP32 operands (`dc = 0`).
    function _arith(uint8 op, uint32 a, uint32 b) private pure returns (RoundingRule.Enclosure memory x, bool) {
        if (op == OpKinds.DIV) return _div(a, b);
        uint256[] memory terms;
        if (op == OpKinds.MUL) {
            terms = new uint256[](1);
            terms[0] = ExactSum.product(a, b);
        } else {
            terms = new uint256[](2);
            terms[0] = ExactSum.value(a);
            terms[1] = op == OpKinds.SUB ? ExactSum.negated(ExactSum.value(b)) : ExactSum.value(b);
        }
        return (ExactSum.exactEnclosure(ExactSum.accumulate(terms)), true);
    }

    /// @dev a / b as the rational `ma * 2^(xa - xb) / mb`; undefined for b = 0.
    function _div(uint32 a, uint32 b) private pure returns (RoundingRule.Enclosure memory x, bool) {
        Float32.requireFinite(a);
        Float32.requireFinite(b);
        (bool na, uint256 ma, int256 xa) = Float32.decode(a);
        (bool nb, uint256 mb, int256 xb) = Float32.decode(b);
        if (mb == 0) return (x, false);
        int256 v = na != nb ? -int256(ma) : int256(ma);
        return (RoundingRule.Enclosure(v, v, 0, xa - xb, mb), true);
    }

    /// @dev sqrt(a) enclosed in [r, r + 1) * 2^((x - s) / 2), r = isqrt(m << s), s >= 200 (exact
    ///      when r^2 = m << s); undefined for a < 0.
    function _sqrt(uint32 a) private pure returns (RoundingRule.Enclosure memory x, bool) {
        Float32.requireFinite(a);
        (bool neg, uint256 m, int256 e) = Float32.decode(a);
        if (m == 0) return (RoundingRule.exactly(0), true);
        if (neg) return (x, false);
        uint256 s = e & 1 == 0 ? 200 : 201;
        uint256 big = m << s;
        uint256 r = Float32.isqrt(big);
        int256 lo = int256(r);
        return (RoundingRule.Enclosure(lo, r * r == big ? lo : lo + 1, 0, (e - int256(s)) / 2, 1), true);
    }

    /// @dev out[..., i, j] = sum_k a[..., i, k] * b[..., j, k] (+ bias[j]); n = K (+1).
    function _matmul(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        bool hasBias = c.roots.length == 3;
        if (c.roots.length != 2 && !hasBias) revert InputCount(c.kind, c.roots.length, 2);
        (uint256 bad, uint256 m, uint256 nOut, uint256 kk) = TensorIndex.matmulDims(c.shape, c.inShapes);
        if (bad != type(uint256).max) revert ShapeMismatch(c.kind, bad);

        uint256 j = c.index % nOut;
        uint256 row = c.index / nOut; // batch * M + i
        uint256 batch = row / m;
        (bytes memory aData, uint256 aOff) = _readRow(c, 0, row * kk, kk);
        (bytes memory bData, uint256 bOff) = _readRow(c, 1, (batch * nOut + j) * kk, kk);
        uint256 n = hasBias ? kk + 1 : kk;
        uint256[] memory terms = new uint256[](n);
        ExactSum.fill(aData, aOff, bData, bOff, terms, kk);
        if (hasBias) terms[kk] = ExactSum.value(_read(c, 2, j));
        ExactSum.Accumulation memory acc = ExactSum.accumulate(terms);
        (c.terms, c.sum, c.lsbExp) = (terms, acc.sum, acc.lsbExp);
        return ExactSum.sumEnclosure(acc, n);
    }

    /// @dev SUM MEAN MAX over the last axis of a [..., n]; out [..., 1].
    function _reduce(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 1);
        uint256 n = TensorIndex.reducedLength(c.shape, c.inShapes[0]);
        if (n == 0) revert ShapeMismatch(c.kind, 0);
        // SAFETY: a MAX row is read whole (no chunk level): bounded so the ruling fits one transaction.
        if (c.kind == OpKinds.MAX && n > MAX_ROW) revert RowTooLong(c.kind, n, MAX_ROW);
        // The output's last dim is 1, so its flat index is the row number.
        (bytes memory data, uint256 off) = _readRow(c, 0, c.index * n, n);
        if (c.kind == OpKinds.MAX) {
            uint32 best = TensorProof.f32At(data, off);
            Float32.requireFinite(best);
            for (uint256 t = 1; t < n; ++t) {
                uint32 v = TensorProof.f32At(data, off + t);
                Float32.requireFinite(v);
                if (Float32.toOrdered(v) > Float32.toOrdered(best)) best = v;
            }
            return RoundingRule.exactly(best);
        }
        uint256[] memory terms = new uint256[](n);
        ExactSum.fill(data, off, "", 0, terms, n);
        ExactSum.Accumulation memory acc = ExactSum.accumulate(terms);
        (c.terms, c.sum, c.lsbExp) = (terms, acc.sum, acc.lsbExp);
        return c.kind == OpKinds.SUM ? ExactSum.sumEnclosure(acc, n) : ExactSum.meanEnclosure(acc, n);
    }

    /// @dev OUTPUT RESHAPE PERMUTE SLICE PAD EXPAND: a copy of one input element (or a PAD zero).
    function _move(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 1);
        uint8 k = c.kind;
        uint32[] memory si = c.inShapes[0];
        if (k == OpKinds.OUTPUT || k == OpKinds.RESHAPE) {
            if (TensorIndex.numel(si) != TensorIndex.numel(c.shape)) revert ShapeMismatch(k, 0);
            return RoundingRule.exactly(_read(c, 0, c.index));
        }
        uint256[] memory idx = TensorIndex.unravel(c.index, c.shape);
        if (k == OpKinds.EXPAND) {
            if (!TensorIndex.broadcastsTo(si, c.shape)) revert ShapeMismatch(k, 0);
            return RoundingRule.exactly(_read(c, 0, TensorIndex.ravelBroadcast(idx, si)));
        }
        uint256 r = c.shape.length;
        if (k == OpKinds.PERMUTE) {
            if (si.length != r) revert ShapeMismatch(k, 0);
            if (c.attrs.length != r) revert BadAttrs(k, c.attrs.length);
            uint256[] memory inIdx = new uint256[](r);
            uint256 seen;
            for (uint256 d = 0; d < r; ++d) {
                uint256 p = c.attrs[d];
                if (p >= r || seen & (1 << p) != 0) revert BadAttrs(k, d);
                seen |= 1 << p;
                if (si[p] != c.shape[d]) revert ShapeMismatch(k, 0);
                inIdx[p] = idx[d];
            }
            return RoundingRule.exactly(_read(c, 0, TensorIndex.ravelBroadcast(inIdx, si)));
        }
        // SLICE and PAD: attrs [axis, start]; shapes agree except on `axis`.
        if (c.attrs.length != 2 || c.attrs[0] >= r) revert BadAttrs(k, 0);
        uint256 axis = c.attrs[0];
        uint256 start = c.attrs[1];
        if (!TensorIndex.sameExcept(si, c.shape, axis)) revert ShapeMismatch(k, 0);
        if (k == OpKinds.SLICE) {
            if (start > si[axis] || c.shape[axis] > si[axis] - start) revert BadAttrs(k, 1);
            idx[axis] += start;
        } else {
            if (start > c.shape[axis] || si[axis] > c.shape[axis] - start) revert BadAttrs(k, 1);
            uint256 t = idx[axis];
            if (t < start || t - start >= si[axis]) return RoundingRule.exactly(0);
            idx[axis] = t - start;
        }
        return RoundingRule.exactly(_read(c, 0, TensorIndex.ravelBroadcast(idx, si)));
    }

    /// @dev CONCAT: the inputs' elements one after another (each row-major) as a 1-D output.
    function _concat(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        uint256 n = c.roots.length;
        // INVARIANT: at least one input (openOp bounds them by MAX_OP_INPUTS); a 1-D output.
        if (n == 0) revert InputCount(c.kind, 0, 1);
        if (c.shape.length != 1) revert ShapeMismatch(c.kind, n);
        uint256 total;
        uint256 at = n;
        uint256 off;
        for (uint256 i = 0; i < n; ++i) {
            uint256 size = TensorIndex.numel(c.inShapes[i]);
            if (at == n && c.index < total + size) {
                at = i;
                off = total;
            }
            total += size;
        }
        // INVARIANT: the output holds exactly the inputs' elements (so index < total picks an input).
        if (total != c.shape[0]) revert ShapeMismatch(c.kind, n);
        return RoundingRule.exactly(_read(c, at, c.index - off));
    }

    /// @dev out[..., c] = 1.0 if idx[...] == c else 0 (exact float compare); attrs [C].
    function _oneHot(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 1);
        uint256 r = c.shape.length;
        if (c.attrs.length != 1 || r == 0 || c.attrs[0] != c.shape[r - 1] || c.attrs[0] == 0) {
            revert BadAttrs(c.kind, 0);
        }
        uint32[] memory si = c.inShapes[0];
        if (si.length + 1 != r) revert ShapeMismatch(c.kind, 0);
        for (uint256 i = 0; i < si.length; ++i) {
            if (si[i] != c.shape[i]) revert ShapeMismatch(c.kind, 0);
        }
        uint256 classes = c.attrs[0];
        uint32 v = _read(c, 0, c.index / classes);
        (bool ok, uint256 k) = _asIndex(v);
        return RoundingRule.exactly(ok && k == c.index % classes ? Float32.ONE : 0);
    }

    /// @dev out[..., 0] = x[..., idx[...]], +0 when idx is not an integer in [0, n); x [..., n], idx [..., 1].
    function _gather(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 2);
        uint32[] memory sx = c.inShapes[0];
        uint256 r = c.shape.length;
        if (r == 0 || !TensorIndex.sameExcept(sx, c.shape, r - 1) || sx[r - 1] == 0) revert ShapeMismatch(c.kind, 0);
        if (!TensorIndex.sameExcept(c.inShapes[1], c.shape, type(uint256).max) || c.shape[r - 1] != 1) {
            revert ShapeMismatch(c.kind, 1);
        }
        uint256 n = sx[r - 1];
        (bool ok, uint256 k) = _asIndex(_read(c, 1, c.index));
        if (!ok || k >= n) return RoundingRule.exactly(0);
        return RoundingRule.exactly(_read(c, 0, c.index * n + k));
    }

    /// @dev out[p, j, q] = x[p, idx[j], q], +0 when idx[j] is not an integer in [0, n); attrs [axis],
    ///      shape = x.shape[:axis] ++ idx.shape ++ x.shape[axis+1:], n = x.shape[axis] (flat p, j, q).
    function _take(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 2);
        uint32[] memory sx = c.inShapes[0];
        uint32[] memory si = c.inShapes[1];
        if (c.attrs.length != 1 || c.attrs[0] >= sx.length) revert BadAttrs(c.kind, 0);
        uint256 axis = c.attrs[0];
        // INVARIANT: the output shape is exactly x's with its `axis` dim replaced by idx's dims.
        if (c.shape.length != sx.length - 1 + si.length) revert ShapeMismatch(c.kind, 0);
        uint256 q = 1;
        for (uint256 d = 0; d < c.shape.length; ++d) {
            uint256 want = d < axis ? sx[d] : d < axis + si.length ? si[d - axis] : sx[d + 1 - si.length];
            if (c.shape[d] != want) revert ShapeMismatch(c.kind, d < axis || d >= axis + si.length ? 0 : 1);
            if (d >= axis + si.length) q *= want;
        }
        uint256 jn = TensorIndex.numel(si);
        uint256 j = (c.index / q) % jn;
        (bool ok, uint256 k) = _asIndex(_read(c, 1, j));
        uint256 n = sx[axis];
        if (!ok || k >= n) return RoundingRule.exactly(0);
        return RoundingRule.exactly(_read(c, 0, ((c.index / (q * jn)) * n + k) * q + c.index % q));
    }

    /// @dev out[i] = a[i] if cond[i] != 0 else b[i], each input broadcasting to the output.
    function _select(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 3);
        uint256[] memory idx = TensorIndex.unravel(c.index, c.shape);
        for (uint256 i = 0; i < 3; ++i) {
            if (!TensorIndex.broadcastsTo(c.inShapes[i], c.shape)) revert ShapeMismatch(c.kind, i);
        }
        // -0 counts as zero (an FP32 comparison with 0).
        uint256 pick = _read(c, 0, TensorIndex.ravelBroadcast(idx, c.inShapes[0])) & ~Float32.SIGN != 0 ? 1 : 2;
        return RoundingRule.exactly(_read(c, pick, TensorIndex.ravelBroadcast(idx, c.inShapes[pick])));
    }

    /// @dev out[..., k] = g[..., 0] if k is the first index of the row maximum of x [..., n], else +0;
    ///      g [..., 1]. Reads the row of x, then g only at the maximum.
    function _maxGrad(Ctx memory c) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 2);
        _sameShape(c, 0);
        uint256 n = TensorIndex.reducedLength(c.inShapes[1], c.shape);
        if (n == 0) revert ShapeMismatch(c.kind, 1);
        // SAFETY: the row is read whole: bounded so the ruling fits one transaction.
        if (n > MAX_ROW) revert RowTooLong(c.kind, n, MAX_ROW);
        uint256 row = c.index / n;
        (bytes memory data, uint256 off) = _readRow(c, 0, row * n, n);
        uint256 best;
        int256 top = type(int256).min;
        for (uint256 t = 0; t < n; ++t) {
            uint32 v = TensorProof.f32At(data, off + t);
            Float32.requireFinite(v);
            // Strictly greater: the first of equal maxima (+0 and -0 are equal) wins.
            if (Float32.toOrdered(v) > top) (best, top) = (t, Float32.toOrdered(v));
        }
        if (best != c.index % n) return RoundingRule.exactly(0);
        return RoundingRule.exactly(_read(c, 1, row));
    }

    /// @dev out[i] = scale if u(i) >= threshold else +0, u(i) the first 4 bytes (big-endian) of
    ///      sha256(seed || uint64be(step) || uint32be(salt) || uint64be(i)); attrs [threshold, scaleBits, salt].
    function _dropoutMask(Ctx memory c, ElementClaim calldata claim)
        private
        pure
        returns (RoundingRule.Enclosure memory)
    {
        _inputs(c, 0);
        if (c.attrs.length != 3) revert BadAttrs(c.kind, c.attrs.length);
        for (uint256 a = 0; a < 3; ++a) {
            if (c.attrs[a] > type(uint32).max) revert BadAttrs(c.kind, a);
        }
        if (c.index > type(uint64).max) revert IndexOutOfRange(c.index, uint256(type(uint64).max) + 1);
        // SAFETY: every value was checked to fit its cast.
        bytes32 h = sha256(abi.encodePacked(claim.dataSeed, claim.step, uint32(c.attrs[2]), uint64(c.index)));
        if (uint32(bytes4(h)) < c.attrs[0]) return RoundingRule.exactly(0);
        return RoundingRule.exactly(uint32(c.attrs[1]));
    }

    /// @dev out[0] = RN32(step), shape [1] (exact below 2^24).
    function _step(Ctx memory c, ElementClaim calldata claim) private pure returns (RoundingRule.Enclosure memory) {
        _inputs(c, 0);
        if (c.shape.length != 1 || c.shape[0] != 1) revert ShapeMismatch(c.kind, 0);
        if (c.attrs.length != 0) revert BadAttrs(c.kind, 0);
        int256 s = int256(uint256(claim.step));
        return RoundingRule.Enclosure(s, s, 0, 0, 1);
    }

    /// @dev out[j, k] = sample(idx)[k], idx = sha256(seed || uint64be(step) || uint32be(j)) mod nSamples.
    function _data(Ctx memory c, ElementClaim calldata claim) private view returns (RoundingRule.Enclosure memory) {
        _inputs(c, 0);
        if (c.shape.length != 2) revert ShapeMismatch(c.kind, 0);
        if (claim.nSamples == 0) revert NoSamples();
        uint256 len = c.shape[1];
        // SAFETY: the sample is opened whole: bounded so the ruling fits one transaction.
        if (len > MAX_SAMPLE) revert RowTooLong(c.kind, len, MAX_SAMPLE);
        uint256 j = c.index / len;
        // SAFETY: j < shape[0] < 2^32, so the uint32 cast is exact.
        uint256 sample =
            uint256(sha256(abi.encodePacked(claim.dataSeed, claim.step, uint32(j)))) % claim.nSamples;
        Opening memory o = _nextOpening(c);
        if (o.data.length != len * 4) revert TensorProof.OpeningLength(o.data.length, len * 4);
        TensorProof.verifyRange(claim.dataRoot, sample, claim.nSamples, o.data, len * 4, o.siblings);
        uint32 v = TensorProof.f32At(o.data, c.index % len);
        return RoundingRule.exactly(v);
    }

    // ---------------------------------------------------------------------------------------------
    // Openings
    // ---------------------------------------------------------------------------------------------

    /// @dev The verified, finite FP32 element `flat` of input `input` (one chunk opening).
    function _read(Ctx memory c, uint256 input, uint256 flat) private view returns (uint32 v) {
        (bytes memory data, uint256 off) = _readRow(c, input, flat, 1);
        v = TensorProof.f32At(data, off);
        Float32.requireFinite(v);
    }

    /// @dev Verifies the chunks of elements [start, start + len) of input `input`; returns the
    ///      opened bytes and the position of element `start` in them.
    function _readRow(Ctx memory c, uint256 input, uint256 start, uint256 len)
        private
        view
        returns (bytes memory data, uint256 off)
    {
        Opening memory o = _nextOpening(c);
        uint256 base = TensorProof.verifyElements(
            c.roots[input], TensorIndex.numel(c.inShapes[input]), start, len, o.data, o.siblings
        );
        return (o.data, start - base);
    }

    function _nextOpening(Ctx memory c) private pure returns (Opening memory o) {
        if (c.next >= c.openings.length) revert OpeningCount(c.openings.length, c.next + 1);
        o = c.openings[c.next];
        ++c.next;
    }

    // ---------------------------------------------------------------------------------------------
    // Small helpers
    // ---------------------------------------------------------------------------------------------

    function _inputs(Ctx memory c, uint256 expected) private pure {
        if (c.roots.length != expected) revert InputCount(c.kind, c.roots.length, expected);
    }

    function _sameShape(Ctx memory c, uint256 input) private pure {
        if (!TensorIndex.sameExcept(c.inShapes[input], c.shape, type(uint256).max)) revert ShapeMismatch(c.kind, input);
    }

    /// @dev True for FP32 values > 0 (sign clear and not zero).
    function _positive(uint32 v) private pure returns (bool) {
        return v & Float32.SIGN == 0 && v != 0;
    }

    /// @dev `(true, k)` when the finite FP32 `v` is the non-negative integer k < 2^32.
    function _asIndex(uint32 v) private pure returns (bool, uint256) {
        (bool neg, uint256 m, int256 e) = Float32.decode(v);
        if (m == 0) return (true, 0);
        if (neg) return (false, 0);
        if (e >= 0) return e < 9 ? (true, m << uint256(e)) : (false, 0);
        uint256 sh = uint256(-e);
        if (sh >= 24 || (m & ((1 << sh) - 1)) != 0) return (false, 0);
        return (true, m >> sh);
    }
}
