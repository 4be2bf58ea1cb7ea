"""Commitments: RFC 9162 trees and range openings (``merkle``), every root of ``docs/protocol.md``
(``roots``), and the graph commitment and per-step traces (``trace``)."""
