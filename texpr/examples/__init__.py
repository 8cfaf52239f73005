"""Example programs: two training jobs -- digits (:mod:`.digits`) and a mini-GPT on
the standard library's sources (:mod:`.gpt`, its text in :mod:`.gpt_data`) -- two
models as texpr graphs -- a small ResNet (:mod:`.resnet`) and a mini-GPT
(:mod:`.gpt_model`) -- and the PyTorch twins of those two (:mod:`.models_torch`,
which imports torch)."""
