"""Built-in models, losses and optimizers written against the step-graph builder (``nn``, ``optim``)."""
