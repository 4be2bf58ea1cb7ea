"""What a finished run gives its user: exported weights (``export``), a model to sample from
(``torch_models``, ``sample``), a look inside the run folder (``inspect``) and the seed paper's
log layout (``paper_log``)."""
