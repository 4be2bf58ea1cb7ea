// SPDX-License-Identifier: MIT
pragma solidity 0.8.28;

/// @title OpKinds
/// @notice Primitive op codes of the step graph (docs/protocol.md, "Op kinds"); the same numbers as
///         `vtrain.graph.step_graph.OpKind`. Descriptors carry the code as their first field (`uint8 kind`).
library OpKinds {
    uint8 internal constant INPUT = 0;
    uint8 internal constant OUTPUT = 1;
    uint8 internal constant DATA = 2;
    uint8 internal constant CONST = 3;
    uint8 internal constant ADD = 10;
    uint8 internal constant SUB = 11;
    uint8 internal constant MUL = 12;
    uint8 internal constant DIV = 13;
    uint8 internal constant ADD_S = 14;
    uint8 internal constant MUL_S = 15;
    uint8 internal constant DIV_S = 16;
    uint8 internal constant RSUB_S = 17;
    uint8 internal constant SQRT = 20;
    uint8 internal constant EXP = 21;
    uint8 internal constant LOG = 22;
    uint8 internal constant TANH = 23;
    uint8 internal constant ERF = 24;
    uint8 internal constant MATMUL = 30;
    uint8 internal constant SUM = 31;
    uint8 internal constant MEAN = 32;
    uint8 internal constant MAX = 40;
    uint8 internal constant RELU = 41;
    uint8 internal constant RELU_GRAD = 42;
    uint8 internal constant RESHAPE = 50;
    uint8 internal constant PERMUTE = 51;
    uint8 internal constant SLICE = 52;
    uint8 internal constant PAD = 53;
    uint8 internal constant EXPAND = 54;
    uint8 internal constant ONE_HOT = 55;
    uint8 internal constant GATHER = 56;
    uint8 internal constant TAKE = 57;
    uint8 internal constant SELECT = 58;
    uint8 internal constant MAX_GRAD = 59;
    uint8 internal constant DROPOUT_MASK = 60;
    uint8 internal constant STEP = 61;
    uint8 internal constant CONCAT = 62;
}
