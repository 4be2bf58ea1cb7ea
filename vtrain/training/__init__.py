"""Training runs: the spec (``spec``), datasets (``data``), the train and replay loops (``loop``)
and the run folder on disk (``rundir``)."""
