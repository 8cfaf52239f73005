"""Example programs: the digits training job (:mod:`.digits`), two models as texpr
graphs -- a small ResNet (:mod:`.resnet`) and a mini-GPT (:mod:`.gpt_model`) -- and
the PyTorch twins of those two (:mod:`.models_torch`, which imports torch)."""
