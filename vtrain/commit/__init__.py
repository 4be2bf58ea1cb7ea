"""Commitments: RFC 9162 trees and range openings (``merkle``), every root of ``docs/protocol.md``
(``roots``), the graph commitment and per-step traces (``trace``), and the optional C tree
builder behind them (``native``)."""
