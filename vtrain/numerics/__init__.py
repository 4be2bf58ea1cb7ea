"""Controlled numerics: the certified rounding rule and its log (``rounding``, ``logfile``), the
exact per-element reference the contract mirrors (``exact``) and the EXP/LOG/TANH enclosures
(``transcendental``)."""
