"""The step graph: primitive op kinds, the static graph and its reverse-mode autodiff
(``step_graph``), and the executor that runs one step under a numerics mode (``executor``)."""
