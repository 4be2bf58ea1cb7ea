"""An MLP classifier on a user's arrays (``.npz`` with ``x`` and ``y``, or an ``.npy`` whose last
column is the label), e.g. ``python -c "import numpy as np; np.savez('d.npz', x=..., y=...)"``:

    vtrain train --out runs/npz --model examples/npz_classifier.py:task --model-arg path=d.npz --steps 8

Without ``path`` it uses sklearn's digits (64 features).
"""

from __future__ import annotations

import numpy as np
import torch.nn.functional as F
from torch import nn


def task(path: str | None = None, hidden: int = 32, lr: float = 0.05):
    from vtrain.frontend import TorchTask
    from vtrain.frontend.data import arrays, digits_images

    if path is None:
        x, y = digits_images()
        x = x.reshape(len(x), -1)
    else:
        x, y = arrays(path)
    x = np.asarray(x, np.float32).reshape(len(x), -1)
    y = np.asarray(y).astype(np.int64)
    n_classes = int(y.max()) + 1
    model = nn.Sequential(nn.Linear(x.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, n_classes))
    return TorchTask(model, F.cross_entropy, {"name": "SGD", "lr": lr, "momentum": 0.9}, [x], y)
