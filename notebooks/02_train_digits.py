# ---
# jupyter:
#   jupytext:
#     formats: py:percent
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Training a CNN on handwritten digits with texpr gradients
#
# The model and training loop live in `texpr.examples.digits`; this notebook
# runs them, draws the loss curve and shows test digits with their predictions.
# Set `TEXPR_NOTEBOOK_QUICK=1` for a short run (CI does).

# %%
import os

import matplotlib.pyplot as plt
import numpy as np

from texpr.examples import digits

quick = os.environ.get("TEXPR_NOTEBOOK_QUICK") == "1"
args = digits.parse_args(["--epochs", "1" if quick else "20"] + (["--limit", "400"] if quick else []))
history = digits.train(args)

# %%
fig, ax = plt.subplots(1, 2, figsize=(9, 3))
ax[0].plot(np.arange(1, len(history["loss"]) + 1), history["loss"], "o-")
ax[0].set_xlabel("epoch"); ax[0].set_ylabel("train loss")
ax[1].plot(np.arange(1, len(history["loss"]) + 1), 100 * np.array(history["test_accuracy"]), "s-r")
ax[1].set_xlabel("epoch"); ax[1].set_ylabel("test accuracy (%)")
plt.show()

# %% [markdown]
# ## Test digits and predictions

# %%
from texpr import codegen
import texpr as te

images, labels = digits.load_digits()
if args.limit:
    images, labels = images[:args.limit], labels[:args.limit]
_, x_test, _, y_test = digits.split(images, labels, args.seed)
model = digits.Model(16)
names = list(model.weights)
predict = codegen.build([model.logits], [model.x] + [model.weights[n] for n in names], parallel=False)
(logits,) = predict(x_test[:16, None].astype("float32"), *[history["params"][n] for n in names])
fig, axes = plt.subplots(2, 8, figsize=(10, 3))
for a, img, y, p in zip(axes.ravel(), x_test[:16], y_test[:16], logits.argmax(1)):
    a.imshow(img, cmap="gray_r")
    a.set_title(f"{p}" + ("" if p == y else f" (true {y})"), color="k" if p == y else "r")
    a.axis("off")
plt.show()
